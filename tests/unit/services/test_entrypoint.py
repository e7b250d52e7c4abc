"""The shared service entry point: flags, config errors and exit codes."""

from dataclasses import dataclass

import pytest

from services import errors
from services.entrypoint import build_service_parser, run_service


@dataclass
class Settings:
    node_id: int = 0
    name: str = ""
    log_level: str = "WARNING"
    log_file: None = None


class Taken(RuntimeError):
    pass


def _main(argv, run, **kwargs):
    parser = build_service_parser("svc", "A test service.", Settings, "SVC_TEST")
    return run_service(parser, argv, Settings, "SVC_TEST", log_name=lambda c: "svc", run=run, **kwargs)


async def _ok(config):
    assert config.node_id == 7


def test_runs_with_flags_and_exits_zero():
    assert _main(["--node-id", "7"], _ok) == 0


def test_bad_value_is_exit_2_with_one_line(capsys):
    assert _main(["--node-id", "seven"], _ok) == 2
    assert capsys.readouterr().err.startswith("svc: flag --node-id: bad value 'seven'")


def test_check_problem_is_exit_2(capsys):
    assert _main([], _ok, check=lambda c: None if c.name else "--name is required") == 2
    assert "svc: --name is required" in capsys.readouterr().err


@pytest.mark.parametrize("raised, code", [(Taken("id 1 is taken"), 3), (errors.KafkaStorageError("disk"), 1)])
def test_service_errors_map_to_exit_codes(raised, code, capsys):
    async def fail(config):
        raise raised

    assert _main(["--node-id", "7"], fail, exit_codes={Taken: 3}) == code
    assert str(raised) in capsys.readouterr().err


def test_abbreviated_flags_are_refused():
    with pytest.raises(SystemExit):
        _main(["--node", "7"], _ok)


def test_write_ready_file_replaces_atomically_and_skips_none(tmp_path):
    import json

    from services.entrypoint import write_ready_file

    target = tmp_path / "ready.json"
    write_ready_file(None, {"pid": 1})  # no path: nothing to do
    write_ready_file(target, {"pid": 1, "grpc_port": 5})
    write_ready_file(target, {"pid": 2, "grpc_port": 6})
    assert json.loads(target.read_text()) == {"pid": 2, "grpc_port": 6}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready.json"]  # no .tmp left behind
