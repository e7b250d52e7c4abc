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


def test_the_loader_takes_tls_and_token_flags_for_its_read_and_its_own_connections(tmp_path):
    from spark_jobs.loader import build_parser, config_from_args

    ca, token = tmp_path / "ca.pem", tmp_path / "token"
    ca.write_text("x")
    token.write_text("a.b.c")
    args = build_parser().parse_args(
        ["--topic", "t", "--output", str(tmp_path / "out"), "--servers", "127.0.0.1:1",
         "--ssl-cafile", str(ca), "--token-file", str(token)]
    )  # fmt: skip
    config = config_from_args(args)
    assert dict(config.security_options) == {
        "ssl.cafile": str(ca),
        "sasl.oauthbearer.token.file": str(token),
        "sasl.mechanism": "OAUTHBEARER",
    }
    settings = sdk_settings(config.security)
    assert settings["security_protocol"] == "SASL_SSL" and settings["ssl_cafile"] == str(ca)
    assert settings["sasl_oauth_token_provider"].token() == "a.b.c"
    plain = config_from_args(build_parser().parse_args(["--topic", "t", "--output", "o", "--servers", "h:1"]))
    assert plain.security_options == () and plain.security == ()
    missing = config_from_args(
        build_parser().parse_args(
            ["--topic", "t", "--output", "o", "--servers", "h:1", "--ssl-cafile", "nope.pem"]
        )
    )
    with pytest.raises(OptionError, match=r"ssl\.cafile"):
        _ = missing.security
