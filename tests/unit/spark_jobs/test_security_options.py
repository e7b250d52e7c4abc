"""TLS options of the Spark source and sink: passed to the SDK, checked on the driver."""

import pytest

from spark_jobs.options import OptionError, ReadOptions, WriteOptions, sdk_settings


def test_tls_options_become_sdk_settings(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    read = ReadOptions.parse({"subscribe": "t", "ssl.cafile": str(ca)}, streaming=False)
    assert sdk_settings(read.security) == {"security_protocol": "SSL", "ssl_cafile": str(ca)}
    write = WriteOptions.parse({"topic": "t", "security.protocol": "PLAINTEXT"})
    assert sdk_settings(write.security) == {"security_protocol": "PLAINTEXT"}
    assert ReadOptions.parse({"subscribe": "t"}, streaming=False).security == ()


def test_bad_tls_options_name_the_option(tmp_path):
    with pytest.raises(OptionError, match=r"ssl\.cafile"):
        ReadOptions.parse({"subscribe": "t", "ssl.cafile": str(tmp_path / "missing.pem")}, streaming=False)
    with pytest.raises(OptionError, match=r"security\.protocol"):
        WriteOptions.parse({"security.protocol": "SASL_SSL"})
