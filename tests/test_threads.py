"""The thread rule of ``recast_cli/threads.py``: unit cases, then through the real entry point."""

import os
import subprocess
import sys

import pytest

from recast_cli.errors import BadInput
from recast_cli.threads import USER_VARS, apply, choose

MAIN = "from recast_cli.cli import main; main()"
PROBE = ("import os, sys; os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}}) if {pin} else None; "
         "from recast_cli import threads; threads.apply(); import torch; "
         "print(torch.get_num_threads(), os.environ.get('OMP_NUM_THREADS'))")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in (*USER_VARS, "RECAST_THREADS")}
    return {**env, **extra}


@pytest.mark.parametrize("environ, threads", [
    ({}, None),                                       # one process: torch's default is fastest
    ({"RECAST_THREADS": "3"}, 3),                     # explicit choice wins over everything
    ({"RECAST_THREADS": "3", "OMP_NUM_THREADS": "2"}, 3),
    ({"OMP_NUM_THREADS": "2"}, None),                 # the user's OMP setting is left alone
    ({"MKL_NUM_THREADS": "4"}, None),
    ({"RECAST_THREADS": "auto"}, None),
    ({"RECAST_THREADS": " AUTO "}, None),
    ({"OMP_NUM_THREADS": ""}, None),                  # empty means unset
])
def test_rule(environ, threads):
    assert choose(environ).threads == threads


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "99999"])
def test_bad_values_are_refused(value):
    with pytest.raises(BadInput, match="RECAST_THREADS"):
        choose({"RECAST_THREADS": value})


def test_apply_writes_both_variables():
    environ = {"RECAST_THREADS": "2"}
    assert apply(environ).threads == 2
    assert environ["OMP_NUM_THREADS"] == environ["MKL_NUM_THREADS"] == "2"
    untouched = {"OMP_NUM_THREADS": "3"}
    apply(untouched)
    assert untouched == {"OMP_NUM_THREADS": "3"}


@pytest.mark.parametrize("pin, extra, expected", [
    (True, {}, "1 None"),                                # torch's default on a one-CPU affinity mask
    (True, {"RECAST_THREADS": "2"}, "2 2"),
    (True, {"OMP_NUM_THREADS": "2"}, "2 2"),
])
def test_torch_gets_the_choice(pin, extra, expected):
    probe = subprocess.run([sys.executable, "-c", PROBE.format(pin=pin)], env=clean_env(**extra),
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == expected.split()


def test_bad_value_through_the_cli_is_one_line_exit_2():
    bad = subprocess.run([sys.executable, "-c", MAIN, "--version"], env=clean_env(RECAST_THREADS="lots"),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "RECAST_THREADS='lots'" in bad.stderr
    good = subprocess.run([sys.executable, "-c", MAIN, "--version"], env=clean_env(RECAST_THREADS="1"),
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0 and good.stdout.startswith("recast ")


def test_shards_share_the_cores_unless_the_user_chose():
    from recast_cli.threads import share_cores

    env: dict[str, str] = {}
    choice = share_cores(2, env, cores=2)
    assert choice.threads == 1 and env == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env = {}
    assert share_cores(3, env, cores=16).threads == 5 and env["OMP_NUM_THREADS"] == "5"
    for chosen in ({"RECAST_THREADS": "2"}, {"OMP_NUM_THREADS": "4"}):
        env = dict(chosen)
        assert share_cores(2, env, cores=2).threads in (2, None) and env == chosen  # the user's choice stands
    env = {}
    assert share_cores(1, env, cores=2).threads is None and env == {}
    assert share_cores(4, {}, cores=2).threads == 1
