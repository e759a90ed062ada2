"""The command line on top of the libraries: a calibration refusal reaches the user as the
command line's error, and the libraries take no parsed arguments."""

from __future__ import annotations

import argparse

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.calibration.sweep.rebuild import RebuildError
from engine_advisor.cli.errors import CliError, run_handler
from engine_advisor.cli.main import main


def _run(handler) -> int:
    return run_handler(argparse.Namespace(handler=handler))


def test_a_calibration_error_prints_as_the_cli_s_own(capsys):
    def refuse(args):
        raise RebuildError("RUN_DIR runs/x: no manifest.json")

    assert issubclass(RebuildError, CalibrationError)
    assert _run(refuse) == 2
    assert capsys.readouterr().err == "engine-advisor: error: RUN_DIR runs/x: no manifest.json\n"


def test_a_cli_error_and_a_plain_exit_status(capsys):
    def refuse(args):
        raise CliError("--out: missing")

    assert _run(refuse) == 2
    assert capsys.readouterr().err == "engine-advisor: error: --out: missing\n"
    assert _run(lambda args: 3) == 3
    assert _run(lambda args: None) == 0


def test_rebuild_of_a_folder_that_is_no_run_is_exit_2(capsys, tmp_path):
    assert main(["calibrate", "rebuild", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("engine-advisor: error: ") and "Traceback" not in err
