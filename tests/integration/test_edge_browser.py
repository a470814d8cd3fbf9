"""The chat page end to end in headless Chromium: load `/`, authenticate, send a prompt, watch it stream.

Debian's ``chromium`` driven by Playwright (``executable_path``: no browser is
downloaded, ever); the edge runs in-process with auth on, the worker is the
real one (tests/edge_support.py). The test records the answer's text after
every DOM change, so it sees the text arrive in steps, then checks the
tokens/s and acceptance figures and that the text marked as accepted drafts
matches what the speculation statistics say.
"""
from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.edge.keys import create_key
from streams.edge.server import RunningEdge, serve_in_thread
from streams.testing.stack import Stack
from tests.edge_support import edge_options, shared_worker, wait_ready
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(400)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Text the answer repeats lets prompt-lookup (n-gram) drafts be accepted.
PROMPT = "Repeat this list exactly twice: red, green, blue, yellow, purple, orange."


@pytest.fixture(scope="session")
def edge_worker(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    yield from shared_worker(kafka_bootstrap)


@pytest.fixture(scope="module")
def edge_and_key(kafka_bootstrap: str, edge_worker: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningEdge, str]]:  # noqa: F811
    keys_file: Path = tmp_path_factory.mktemp("keys") / "keys.json"
    key, _ = create_key(keys_file, "browser")
    options = edge_options(kafka_bootstrap, edge_worker.topic_prefix, f"web-{uuid.uuid4().hex[:6]}", keys_file)
    with serve_in_thread(options) as edge:
        wait_ready(edge.base_url, edge_worker)
        yield edge, key


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} not found: install Debian's chromium (./dev test installs it)")
    assert shutil.which("chromedriver"), "chromium-driver is part of the system packages ./dev installs"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


RECORD_SNAPSHOTS = """
() => {
  window.__snapshots = [];
  const log = document.getElementById("log");
  new MutationObserver(() => {
    const answers = log.querySelectorAll(".msg.assistant .text");
    const last = answers[answers.length - 1];
    if (last) window.__snapshots.push(last.textContent);
  }).observe(log, {childList: true, subtree: true, characterData: true});
}
"""


def test_chat_page_streams_an_answer_and_shows_speculation(browser, edge_and_key, tmp_path: Path) -> None:
    edge, key = edge_and_key
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(edge.base_url + "/")
        assert page.title() == "specstream"
        # Without a key the websocket is refused (1008) and the page says so.
        page.wait_for_function("document.getElementById('status').textContent.includes('rejected')", timeout=30_000)

        page.fill("#api-key", key)
        page.click("#connect")
        page.wait_for_function("document.getElementById('status').textContent.includes('tenant browser')",
                               timeout=30_000)
        page.wait_for_function("document.getElementById('model').options.length > 0", timeout=30_000)

        page.evaluate(RECORD_SNAPSHOTS)
        page.fill("#max-tokens", "48")
        page.fill("#prompt", PROMPT)
        page.click("#send")
        page.wait_for_selector(".msg.assistant[data-state=done]", timeout=180_000)

        snapshots = [s for s in page.evaluate("window.__snapshots") if s]
        answer = page.inner_text(".msg.assistant .text")
        distinct = list(dict.fromkeys(snapshots))
        # Streamed: the text grew through several intermediate states, each a prefix of the next.
        assert len(distinct) >= 3, distinct
        assert all(b.startswith(a) for a, b in zip(distinct, distinct[1:])), distinct
        assert answer.strip() and answer.startswith(distinct[-1].strip()[:10])

        tps = page.inner_text("#tps")
        acceptance = page.inner_text("#acceptance")
        drafted, accepted = (int(x) for x in page.inner_text("#drafts").split("/"))
        assert re.fullmatch(r"\d+(\.\d)?", tps) and float(tps) > 0, tps
        assert re.match(r"^\d+%", acceptance), acceptance
        assert 0 <= accepted <= drafted
        if drafted:
            assert int(acceptance.rstrip("%")) == round(100 * accepted / drafted)
        # Text from accepted drafts is marked apart from the target's own tokens.
        draft_text = "".join(page.eval_on_selector_all(".msg.assistant .draft", "els => els.map(e => e.textContent)"))
        target_text = "".join(page.eval_on_selector_all(".msg.assistant .target", "els => els.map(e => e.textContent)"))
        assert target_text
        if accepted == 0:
            assert not draft_text  # nothing is marked as a draft that was not one
        elif accepted >= 4:
            assert draft_text, accepted
        meta = page.inner_text(".msg.assistant .meta")
        assert "tokens per target forward" in meta
        page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)
        assert errors == []
    finally:
        page.close()
