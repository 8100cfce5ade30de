"""Checkpoint layout: scanning tiers, the reported step list and its annotation encoding."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from jobset_inplace.agent.config import ConfigError, load_config
from jobset_inplace.trainer.checkpoints import (
    COMPLETE_MARKER,
    MAX_STEP,
    RETIRED_MARKER,
    available_steps,
    decode_steps,
    encode_steps,
    mark_complete,
    parse_canonical_int,
    retire_steps_after,
    scan_tier,
    select_steps,
    step_dir,
)

# No per-example deadline: 2 shared CPU cores make timings noisy. Disk-backed ones run fewer.
PROPERTY = settings(deadline=None)
FS_PROPERTY = settings(deadline=None, max_examples=40)

steps_st = st.integers(min_value=0, max_value=MAX_STEP)
small_steps_st = st.integers(min_value=0, max_value=500)


def make_step(root: Path, step: int, *, complete: bool = True) -> Path:
    d = step_dir(root, step)
    d.mkdir(parents=True)
    (d / "model.bin").write_bytes(b"w" * 8)
    if complete:
        mark_complete(d, durable=False)
    return d


# --- layout ----------------------------------------------------------------------------------


def test_step_dir_is_root_slash_step_dash_number(tmp_path: Path) -> None:
    assert step_dir(tmp_path, 0) == tmp_path / "step-0"
    assert step_dir(tmp_path, 1200) == tmp_path / "step-1200"


@pytest.mark.parametrize("bad", [-1, MAX_STEP + 1])
def test_step_dir_rejects_out_of_range(tmp_path: Path, bad: int) -> None:
    with pytest.raises(ValueError, match="step must be between 0 and"):
        step_dir(tmp_path, bad)


def test_step_dir_rejects_non_int(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        step_dir(tmp_path, True)
    with pytest.raises(TypeError):
        step_dir(tmp_path, 1.0)  # type: ignore[arg-type]


def test_mark_complete_writes_marker_atomically_and_is_idempotent(tmp_path: Path) -> None:
    d = make_step(tmp_path, 7, complete=False)
    (d / "sub").mkdir()
    (d / "sub" / "shard-0").write_bytes(b"x")
    mark_complete(d)
    mark_complete(d)
    assert sorted(p.name for p in d.iterdir()) == [COMPLETE_MARKER, "model.bin", "sub"]
    assert (d / COMPLETE_MARKER).is_file()


# --- scan_tier -------------------------------------------------------------------------------


def test_scan_missing_root_is_empty(tmp_path: Path) -> None:
    assert scan_tier(tmp_path / "nope") == set()


def test_scan_root_that_is_a_file_is_empty(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    assert scan_tier(tmp_path / "f") == set()


def test_scan_reports_only_complete_canonical_step_dirs(tmp_path: Path) -> None:
    for step in (0, 10, 30):
        make_step(tmp_path, step)
    make_step(tmp_path, 40, complete=False)  # partial write
    staging = tmp_path / "step-50.tmp"
    staging.mkdir()
    (staging / COMPLETE_MARKER).write_text("")  # staging dir, even with a marker
    for name in ("step-007", "step-+8", "step--1", "step-9x", "steps-9", "step-", "step- 9"):
        (tmp_path / name).mkdir()
        (tmp_path / name / COMPLETE_MARKER).write_text("")
    (tmp_path / "step-60").write_text("a file, not a directory")
    (tmp_path / "step-70" / COMPLETE_MARKER).mkdir(parents=True)  # marker must be a file
    (tmp_path / ("step-" + "9" * 25)).mkdir()  # beyond MAX_STEP
    (tmp_path / ("step-" + "9" * 25) / COMPLETE_MARKER).write_text("")
    assert scan_tier(tmp_path) == {0, 10, 30}


def test_scan_follows_symlinked_step_dirs(tmp_path: Path) -> None:
    real = make_step(tmp_path / "elsewhere", 5)
    (tmp_path / "tier").mkdir()
    (tmp_path / "tier" / "step-5").symlink_to(real)
    assert scan_tier(tmp_path / "tier") == {5}


def test_scan_unreadable_root_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreadable tier must not be reported as empty: that could discard progress."""

    def denied(path: object) -> object:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", denied)
    with pytest.raises(PermissionError):
        scan_tier(tmp_path)


@FS_PROPERTY
@given(
    st.dictionaries(
        small_steps_st, st.sampled_from(["complete", "partial", "staging", "retired"]), max_size=12
    )
)
def test_partial_dirs_are_never_reported(layout: dict[int, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for step, state in layout.items():
            if state == "staging":
                (root / f"step-{step}.tmp").mkdir()
                continue
            d = make_step(root, step, complete=state != "partial")
            if state == "retired":
                os.replace(d / COMPLETE_MARKER, d / RETIRED_MARKER)
        expected = {s for s, state in layout.items() if state == "complete"}
        assert scan_tier(root) == expected


# --- available_steps / select_steps ----------------------------------------------------------


def test_available_steps_unions_tiers_newest_first(tmp_path: Path) -> None:
    local, persistent = tmp_path / "local", tmp_path / "persistent"
    for s in (100, 110, 120):
        make_step(local, s)
    for s in (50, 100):
        make_step(persistent, s)
    make_step(persistent, 150, complete=False)
    assert available_steps(local, persistent) == [120, 110, 100, 50]
    assert available_steps(None, persistent) == [100, 50]
    assert available_steps(local, None) == [120, 110, 100]
    assert available_steps(None, None) == []
    assert available_steps(tmp_path / "gone", None) == []


def test_available_steps_caps_to_limit(tmp_path: Path) -> None:
    for s in range(20):
        make_step(tmp_path, s)
    assert available_steps(tmp_path, None) == list(range(19, 3, -1))
    assert available_steps(tmp_path, None, limit=3) == [19, 18, 17]


def test_newest_persistent_steps_survive_a_local_tier_far_ahead() -> None:
    """The case a replacement pod (persistent tier only) must still share a step with."""
    local = range(1001, 1041)
    persistent = [0, 500, 1000]
    assert select_steps(local, persistent, limit=6, persistent_reserve=2) == [
        1040,
        1039,
        1038,
        1037,
        1000,
        500,
    ]
    assert select_steps(local, persistent, limit=6, persistent_reserve=0) == list(
        range(1040, 1034, -1)
    )
    # The replacement pod's report overlaps with the healthy member's in step 1000.
    healthy = select_steps(local, persistent)
    replacement = select_steps([], persistent)
    assert max(set(healthy) & set(replacement)) == 1000


@pytest.mark.parametrize(("limit", "reserve"), [(0, 0), (-1, 0), (4, -1)])
def test_select_steps_rejects_bad_limits(limit: int, reserve: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        select_steps([1], [2], limit, persistent_reserve=reserve)


@PROPERTY
@given(
    st.sets(small_steps_st, max_size=40),
    st.sets(small_steps_st, max_size=40),
    st.integers(min_value=1, max_value=20),
    st.data(),
)
def test_selection_is_capped_newest_first_and_keeps_newest_persistent(
    local: set[int], persistent: set[int], limit: int, data: st.DataObject
) -> None:
    reserve = data.draw(st.integers(min_value=0, max_value=limit + 2))
    union = sorted(local | persistent, reverse=True)
    got = select_steps(local, persistent, limit, persistent_reserve=reserve)
    assert len(got) == min(limit, len(union))
    assert got == sorted(set(got), reverse=True)  # strictly newest first
    assert set(got) <= set(union)
    newest_persistent = sorted(persistent, reverse=True)[: min(reserve, limit)]
    assert set(newest_persistent) <= set(got)
    if reserve == 0 or set(newest_persistent) <= set(union[:limit]):
        event("the reserve changes nothing: plain newest-first cap")
        assert got == union[:limit]
    else:
        event("the reserve keeps older persistent steps")
    # Everything reported beyond the reserve is a newest-first prefix of the rest.
    rest = [s for s in union if s not in newest_persistent]
    assert [s for s in got if s not in newest_persistent] == rest[
        : len(got) - len(newest_persistent)
    ]


@FS_PROPERTY
@given(
    st.sets(small_steps_st, max_size=25),
    st.sets(small_steps_st, max_size=25),
    st.integers(min_value=1, max_value=20),
)
def test_available_steps_limit_and_order_on_disk(
    local: set[int], persistent: set[int], limit: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        roots = Path(tmp, "local"), Path(tmp, "persistent")
        for root, steps in zip(roots, (local, persistent), strict=True):
            root.mkdir()
            for s in steps:
                make_step(root, s)
        got = available_steps(*roots, limit=limit)
        assert got == select_steps(local, persistent, limit)
        assert len(got) <= limit
        assert got == sorted(got, reverse=True)


# --- encode / decode -------------------------------------------------------------------------


def test_encode_is_compact_newest_first_and_deduplicated() -> None:
    assert encode_steps([]) == ""
    assert encode_steps([100, 300, 200, 300]) == "300,200,100"
    assert encode_steps({0}) == "0"


def test_encode_rejects_invalid_steps() -> None:
    with pytest.raises(ValueError, match="step must be between"):
        encode_steps([1, -2])


def test_decode_accepts_the_encoded_form() -> None:
    assert decode_steps("") == []
    assert decode_steps("0") == [0]
    assert decode_steps(f"{MAX_STEP},5,0") == [MAX_STEP, 5, 0]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (",", "element 1 is empty"),
        ("3,,1", "element 2 is empty"),
        ("3,1,", "element 3 is empty"),
        ("3, 1", "element 2 (' 1') is not a step number"),
        ("-1", "element 1 ('-1') is not a step number"),
        ("017", "element 1 ('017') is not a step number"),
        ("1e3", "element 1 ('1e3') is not a step number"),
        ("٣", "element 1 ('٣') is not a step number"),  # non-ASCII digit
        ("[1, 2]", "element 1 ('[1') is not a step number"),
        ("1,2", "element 2 (2) is not below the one before (1)"),
        ("2,2", "element 2 (2) is not below the one before (2)"),
        (str(MAX_STEP + 1), f"element 1 ('{MAX_STEP + 1}') exceeds {MAX_STEP}"),
        ("9" * 5000, "element 1 ('99999999999999999999999... (5000 chars)) exceeds"),
        ("\x00" * 5000, "element 1 ('\\x00\\x00\\x00\\x00\\x00\\x0... (5000 chars)) is not"),
    ],
)
def test_decode_rejects_malformed_with_a_useful_message(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match="malformed checkpoint step list") as err:
        decode_steps(text)
    message = str(err.value)
    assert problem in message
    assert "comma-separated" in message
    assert "e.g. '300,200,100'" in message
    assert len(message) < 512  # fits an Event message even for huge input


@PROPERTY
@given(st.lists(steps_st, max_size=40))
def test_encode_decode_round_trip(steps: list[int]) -> None:
    encoded = encode_steps(steps)
    assert decode_steps(encoded) == sorted(set(steps), reverse=True)
    assert encode_steps(decode_steps(encoded)) == encoded


@PROPERTY
@given(st.one_of(st.text(max_size=40), st.text(alphabet="0123456789,- ", max_size=40)))
def test_decode_accepts_only_the_canonical_form(text: str) -> None:
    error = ""
    try:
        steps = decode_steps(text)
    except ValueError as e:
        error, steps = str(e), []
    if error:
        assert error.startswith("malformed checkpoint step list")
    else:
        assert encode_steps(steps) == text


# --- the canonical integer parse (steps, epochs, policy integers, the agent's environment) ----

# int() takes every one of these. Full-width (\uff11) and Arabic-Indic (\u0661) digits are
# escaped (ruff flags them as look-alikes).
NON_CANONICAL = [
    "\uff11",
    "\u0661",
    "1\u0661",
    "1_0",
    " 1",
    "1 ",
    "1\n",
    "+1",
    "-1",
    "-0",
    "01",
    "00",
    "1.0",
    "1e3",
    "0x1",
    "",
]


@pytest.mark.parametrize("text", NON_CANONICAL)
def test_parse_canonical_int_refuses_what_int_takes(text: str) -> None:
    assert parse_canonical_int(text) is None
    with pytest.raises(ValueError, match="malformed checkpoint step list"):
        decode_steps(text or ",")
    with pytest.raises(ValueError, match="malformed checkpoint step list"):
        decode_steps(f"5,{text}")


@pytest.mark.parametrize(
    ("text", "high", "value"),
    [
        ("0", MAX_STEP, 0),
        ("7", MAX_STEP, 7),
        ("10", MAX_STEP, 10),
        (str(MAX_STEP), MAX_STEP, MAX_STEP),
        (str(MAX_STEP + 1), MAX_STEP, None),
        ("9" * 5000, MAX_STEP, None),  # more digits than int() takes: no ValueError
        ("255", 255, 255),
        ("256", 255, None),
        ("1000", 255, None),
    ],
)
def test_parse_canonical_int_reads_decimal_up_to_high(
    text: str, high: int, value: int | None
) -> None:
    assert parse_canonical_int(text, high) == value


@PROPERTY
@given(st.integers(0, MAX_STEP))
def test_parse_canonical_int_reads_back_str(n: int) -> None:
    assert parse_canonical_int(str(n)) == n


@PROPERTY
@given(st.text(max_size=25))
def test_parse_canonical_int_accepts_exactly_str_of_an_int(text: str) -> None:
    value = parse_canonical_int(text)
    event("canonical" if value is not None else "refused")
    assert value is None or str(value) == text


def agent_env(tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text("t")
    return {
        "POD_NAME": "p",
        "POD_NAMESPACE": "ns",
        "JSI_GANGSTATE": "g",
        "JSI_LAUNCHED_CONTAINERS": "trainer",  # process scope, the default
        "JSI_API_SERVER": "http://127.0.0.1:1",
        "JSI_TOKEN_FILE": str(token),
    }


@pytest.mark.parametrize("text", [t for t in NON_CANONICAL if t])
def test_the_agent_environment_refuses_the_same_forms(text: str, tmp_path: Path) -> None:
    """The agent's numeric variables use the same parse (tests of the agent's configuration as
    a whole are in test_agent_logic.py). int() reads each of these as a port (1 or 0)."""
    env = agent_env(tmp_path)
    assert load_config(env).probe_port == 8187
    assert load_config({**env, "JSI_PROBE_PORT": "1"}).probe_port == 1
    with pytest.raises(ConfigError, match="JSI_PROBE_PORT"):
        load_config({**env, "JSI_PROBE_PORT": text})
    in_pod = {k: v for k, v in env.items() if k != "JSI_API_SERVER"}
    in_pod |= {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "JSI_CA_FILE": env["JSI_TOKEN_FILE"]}
    server = load_config({**in_pod, "KUBERNETES_SERVICE_PORT": "443"}).server
    assert server == "https://10.96.0.1:443"
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_PORT"):
        load_config({**in_pod, "KUBERNETES_SERVICE_PORT": text})


# 88 as int() reads it: full-width, Arabic-Indic, underscore, space, sign, leading zero
@pytest.mark.parametrize(
    "text", ["\uff18\uff18", "\u0668\u0668", "8_8", " 88", "88 ", "+88", "088"]
)
def test_the_agent_restart_exit_code_is_canonical(text: str, tmp_path: Path) -> None:
    env = agent_env(tmp_path)
    assert load_config({**env, "JSI_RESTART_EXIT_CODE": "88"}).restart_exit_code == 88
    with pytest.raises(ConfigError, match="JSI_RESTART_EXIT_CODE"):
        load_config({**env, "JSI_RESTART_EXIT_CODE": text})


# --- retire_steps_after ----------------------------------------------------------------------


def test_retire_unmarks_only_newer_steps_and_keeps_data(tmp_path: Path) -> None:
    for s in (10, 20, 30, 40):
        make_step(tmp_path, s)
    assert retire_steps_after(tmp_path, 20) == [40, 30]
    assert scan_tier(tmp_path) == {10, 20}
    assert (step_dir(tmp_path, 40) / RETIRED_MARKER).is_file()
    assert (step_dir(tmp_path, 40) / "model.bin").is_file()
    assert retire_steps_after(tmp_path, 20) == []  # idempotent


def test_retire_everything_when_starting_from_scratch(tmp_path: Path) -> None:
    for s in (0, 10):
        make_step(tmp_path, s)
    assert retire_steps_after(tmp_path, None) == [10, 0]
    assert scan_tier(tmp_path) == set()
    assert retire_steps_after(tmp_path / "missing", None) == []


# --- start-up cost ---------------------------------------------------------------------------


def test_contract_modules_import_only_the_standard_library() -> None:
    """The agent imports these on its start-up critical path (report within 0.3 s)."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import jobset_inplace.trainer.checkpoints, jobset_inplace.trainer\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(' '.join(sorted(new - set(sys.stdlib_module_names) - {'jobset_inplace'})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == ""
