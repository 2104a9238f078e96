"""Every numeric flag refuses nan, inf, negatives, huge and non-numbers at parse: one line naming the flag,
exit 2, before any command runs (issue 40 item 4)."""

from __future__ import annotations

import pytest

from builder.cli.main import build_parser
from builder.core import net
from builder.core.errors import UsageError

# (argv before the flag, the flag)
FLAGS = [
    (["build", "causal-conv1d", "--cuda", "13.0", "--arch", "90"], "--jobs"),
    (["farm"], "--jobs"),
    (["farm"], "--parallel"),
    (["serve"], "--port"),
    (["cache", "clean", "--all"], "--older-than"),
    (["index", "pull", "http://127.0.0.1:9/"], "--timeout"),
    (["index", "pull", "http://127.0.0.1:9/"], "--net-deadline"),
    (["install", "x", "--from", "http://127.0.0.1:9/"], "--net-deadline"),
    (["doctor"], "--net-deadline"),
    (["coverage"], "--net-deadline"),
    (["torch-table"], "--net-deadline"),
]
BAD = ["nan", "inf", "-inf", "-1", "1e400", "1e300", "99999999999999999999999", "abc", ""]


@pytest.mark.parametrize(("argv", "flag"), FLAGS, ids=lambda v: v if isinstance(v, str) else v[0])
@pytest.mark.parametrize("value", BAD)
def test_bad_numbers_refused_at_parse(capsys: pytest.CaptureFixture[str], argv: list[str], flag: str,
                                      value: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*argv, f"{flag}={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert f"argument {flag}:" in errors[0] and repr(value) in errors[0], errors[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(("argv", "flag", "value", "expected"), [
    (["serve"], "--port", "0", 0),
    (["serve"], "--port", "65535", 65535),
    (["farm"], "--jobs", "8", 8),
    (["cache", "clean", "--all"], "--older-than", "0", 0.0),
    (["cache", "clean", "--all"], "--older-than", "1.5", 1.5),
    (["index", "pull", "u"], "--timeout", "0.5", 0.5),
    (["index", "pull", "u"], "--net-deadline", "86400", 86400.0),
])
def test_good_numbers_pass(argv: list[str], flag: str, value: str, expected: float) -> None:
    args = build_parser().parse_args([*argv, flag, value])
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == expected


@pytest.mark.parametrize(("var", "value"), [
    ("BUILDER_NET_DEADLINE", "1e300"), ("BUILDER_NET_DEADLINE", "inf"), ("BUILDER_NET_DEADLINE", "nan"),
    ("BUILDER_NET_TIMEOUT", "-1"), ("BUILDER_NET_RETRIES", "1000000000"), ("BUILDER_UV_DEADLINE", "1e20"),
])
def test_bad_net_variables(var: str, value: str) -> None:
    """1e300 seconds overflowed threading.Timer in a thread (a traceback), then the fetch ran on."""
    with pytest.raises(UsageError, match=var):
        net.NetPolicy.from_env({var: value})
