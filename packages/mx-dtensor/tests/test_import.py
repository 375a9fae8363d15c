import mx_dtensor


def test_version_and_public_api():
    assert mx_dtensor.__version__ == "0.1.0"
    assert isinstance(mx_dtensor.__all__, list)
