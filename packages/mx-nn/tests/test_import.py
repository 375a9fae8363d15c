import mx_nn


def test_version_and_public_api():
    assert mx_nn.__version__ == "0.1.0"
    assert isinstance(mx_nn.__all__, list)
