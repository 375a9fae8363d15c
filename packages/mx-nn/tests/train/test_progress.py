import io

from mx_nn.train.progress import LOG_LINES, Progress


def test_pipe_gets_a_few_plain_lines():
    stream = io.StringIO()
    p = Progress("mxfp8", 50, stream=stream, tty=False)
    for step in range(1, 51):
        p.update(step, 2.0, 1000.0, heldout=1.5 if step == 50 else None)
    p.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == LOG_LINES and "\r" not in stream.getvalue()
    assert lines[0].startswith("mxfp8 step 5/50 loss 2.0000 tok/s 1,000 elapsed ")
    assert lines[-1].startswith("mxfp8 step 50/50 loss 2.0000 held-out 1.5000 tok/s")


def test_terminal_gets_a_bar_with_loss_rate_and_eta():
    stream = io.StringIO()
    p = Progress("bf16", 4, start=1, stream=stream, tty=True)
    for step in range(2, 5):
        p.update(step, 3.25, 2048.0)
    p.close()
    text = stream.getvalue()
    assert "\r" in text and "bf16" in text and "4/4" in text
    assert "loss=3.250" in text and "tok/s=2,048" in text and "<" in text  # tqdm's ETA
    quiet = io.StringIO()
    off = Progress("bf16", 4, stream=quiet, tty=True, enabled=False)
    off.update(1, 1.0, 1.0)
    off.close()
    assert quiet.getvalue() == ""
