"""``kubectl_complete-jobset_inplace``: what kubectl's completion of ``kubectl jobset-inplace``
offers, from the plugin's own parser and the namespace's gangs."""

from __future__ import annotations

import io

from jobset_inplace.kubectl_plugin.completion import NO_FILES, completions, main

asked: list[tuple[str | None, str | None, str | None]] = []


def gangs(kubeconfig: str | None, context: str | None, namespace: str | None) -> list[str]:
    asked.append((kubeconfig, context, namespace))
    return ["train", "tune", "eval"]


def test_subcommands_then_their_flags_and_output_values() -> None:
    assert completions([""], gangs) == (
        ["doctor", "enable", "history", "list", "restart", "status", "version"],
        NO_FILES,
    )
    assert completions(["st"], gangs) == (["status"], NO_FILES)
    found, _ = completions(["status", "train", "--"], gangs)
    assert {"--output", "--watch", "--interval", "--namespace", "--request-timeout"} <= set(found)
    assert completions(["status", "train", "-o", ""], gangs) == (["yaml", "json", "wide"], NO_FILES)
    assert completions(["list", "--output=y"], gangs) == (["--output=yaml"], NO_FILES)
    assert completions(["--context", "prod", "li"], gangs) == (["list"], NO_FILES)


def test_gang_names_from_the_namespace_the_typed_flags_select() -> None:
    asked.clear()
    found = completions(["-n", "ml", "status", "--kubeconfig", "/k", "t"], gangs)
    assert found == (["train", "tune"], NO_FILES)
    assert asked == [("/k", None, "ml")]
    assert completions(["history", "--namespace=team", ""], gangs)[0] == ["eval", "train", "tune"]
    assert asked[-1] == (None, None, "team")
    assert completions(["status", "train", ""], gangs) == ([], NO_FILES), "one NAME only"
    assert completions(["list", ""], gangs) == ([], NO_FILES), "list takes no NAME"


def test_a_file_flag_leaves_files_to_the_shell_and_no_cluster_completes_nothing() -> None:
    assert completions(["enable", "-f", ""], gangs) == ([], 0)

    def unreachable(*_: str | None) -> list[str]:
        raise ConnectionRefusedError("no cluster")

    assert completions(["status", ""], unreachable) == ([], NO_FILES)


def test_the_executable_prints_one_completion_per_line_then_the_directive() -> None:
    out = io.StringIO()
    assert main(["ver"], out) == 0
    assert out.getvalue() == "version\n:4\n"
