"""`specstream eval run --lm-eval`: the bundled tasks, the comparison with lm-eval's hf model (within stderr), the
tables, where the key comes from, and the options that belong to the other kind of `eval run`."""
from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from streams.cli import main
from streams.eval.harness import (
    BUNDLED_TASKS,
    MetricRow,
    api_key,
    bundled_task_config,
    load_tasks,
    metric_rows,
    results_table,
    sample_agreement,
    split_tasks,
    table,
)


def _results(acc: float, stderr: float, em: float = 0.5) -> dict:
    return {"results": {"mc": {"alias": "mc", "sample_len": 30, "acc,none": acc, "acc_stderr,none": stderr},
                        "gen": {"alias": "gen", "exact_match,last_word": em, "exact_match_stderr,last_word": 0.1}},
            "versions": {"mc": 1.0, "gen": 1.0}, "n-shot": {"mc": 0, "gen": 0},
            "higher_is_better": {"mc": {"acc": True}, "gen": {"exact_match": True}}}


def test_the_bundled_tasks_read_their_jsonl_beside_them_from_any_folder(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in BUNDLED_TASKS:
        files = bundled_task_config(name)["dataset_kwargs"]["data_files"]
        assert all(Path(f).is_absolute() and Path(f).is_file() for f in files.values())
    tasks = load_tasks(list(BUNDLED_TASKS))
    scored, generated = split_tasks(tasks)
    assert [t.task_name for t in scored] == ["specstream_mc"] and [t.task_name for t in generated] == ["specstream_gen"]
    assert len(tasks["specstream_mc"].eval_docs) == 30 and len(tasks["specstream_gen"].eval_docs) == 20


def test_two_scores_agree_when_they_differ_by_at_most_the_larger_stderr() -> None:
    rows = {(r.task, r.metric): r for r in metric_rows(_results(0.60, 0.09), _results(0.52, 0.05))}
    assert set(rows) == {("mc", "acc,none"), ("gen", "exact_match,last_word")}  # sample_len is no metric
    assert rows[("mc", "acc,none")].agrees and rows[("mc", "acc,none")].tolerance == 0.09
    assert not metric_rows(_results(0.60, 0.05), _results(0.40, 0.05))[0].agrees
    assert MetricRow("t", "m", 1.0, 0.0, 1.0, 0.0).agrees  # no spread: equal only
    assert not MetricRow("t", "m", 1.0, 0.0, 0.95, 0.0).agrees
    assert MetricRow("t", "m", 0.5, 0.1).agrees is None  # nothing to compare with


def test_the_tables_show_lm_evals_columns_and_the_comparison() -> None:
    text = results_table(_results(0.6, 0.09))
    assert text.splitlines()[0] == "| Tasks | Version | Filter | n-shot | Metric | | Value | | Stderr |"
    assert "| mc | 1.0 | none | 0 | acc | ↑ | 0.6000 | ± | 0.0900 |" in text
    compared = table(metric_rows(_results(0.6, 0.09), _results(0.3, 0.09)))
    assert "| mc | acc,none | 0.6000 | 0.0900 | 0.3000 | 0.0900 | 0.3000 | NO |" in compared
    assert "hf" not in table(metric_rows(_results(0.6, 0.09))).splitlines()[0]


def test_item_by_item_the_runs_are_compared_by_log_likelihood_or_by_text() -> None:
    def run(ll: float, text: str) -> dict:
        return {"samples": {"mc": [{"doc_id": 0, "resps": [[[ll, True]], [[-3.0, False]]]}],
                            "gen": [{"doc_id": 0, "resps": [[text]]}, {"doc_id": 1, "resps": [["b"]]}]}}

    closeness = sample_agreement(run(-1.0, "a"), run(-1.00002, "x"))
    assert closeness == {"mc": "2 log-likelihoods, largest |edge - hf| 2.00e-05",
                         "gen": "1 of 2 generated answers the same text"}


def test_the_key_is_the_given_one_then_the_environments_then_the_local_one(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    settings = SimpleNamespace(edge=SimpleNamespace(auth=SimpleNamespace(enabled=True, keys_file=str(keys_file))))
    assert api_key("given", settings, {"SPECSTREAM_API_KEY": "env"}) == "given"
    assert api_key(None, settings, {"OPENAI_API_KEY": "openai", "SPECSTREAM_API_KEY": "env"}) == "env"
    assert api_key(None, settings, {"OPENAI_API_KEY": "openai"}) == "openai"
    assert api_key(None, settings, {}) is None  # no local key yet
    (tmp_path / "local.key").write_text("sk-local\n")
    assert api_key(None, settings, {}) == "sk-local"
    settings.edge.auth.enabled = False
    assert api_key(None, settings, {}) is None


@pytest.fixture()
def _config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_CONFIG", "/dev/null")
    monkeypatch.setenv("SPECSTREAM_KAFKA__TOPIC_PREFIX", f"evalcli-{uuid.uuid4().hex[:8]}")


@pytest.mark.usefixtures("_config")
@pytest.mark.parametrize(("argv", "said"), [
    (["--samples", "s.jsonl", "--hf"], "--hf go with --lm-eval"),
    (["--samples", "s.jsonl", "--limit", "3"], "--limit go with --lm-eval"),
    (["--lm-eval", "--max-tokens", "8"], "--max-tokens go with --samples"),
    (["--lm-eval", "--min-token-f1", "0.5"], "--min-token-f1 go with --samples"),
    (["--lm-eval", ","], "--lm-eval needs task names"),
    (["--lm-eval", "--limit", "0"], "--limit a positive number"),
])
def test_options_of_the_other_kind_of_run_are_a_configuration_error(argv: list[str], said: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "run", *argv]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.usefixtures("_config")
def test_an_unknown_lm_eval_task_exits_3_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    # lm-eval indexes its own task folders for a name that is not bundled (seconds), then cannot find it.
    assert main(["eval", "run", "--lm-eval", "specstream_mc,no_such_task_here"]) == 3
    assert "unknown lm-eval task in specstream_mc, no_such_task_here" in capsys.readouterr().err


def test_samples_or_lm_eval_one_of_them() -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "run"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit):
        main(["eval", "run", "--samples", "s.jsonl", "--lm-eval"])
