"""The web console end to end, in a real headless Chromium (Debian's `chromium`, driven by Playwright for Python)
against a real server over the default repository, with an API key and an admin key configured.

Chat with SmolLM2 streams "Paris"; a chart moves after traffic; the embedding model is unloaded and loaded with
the admin key (and refused without it); the embeddings and v2 tabs answer; nothing moves while an answer streams;
the page fits a phone; axe-core finds no serious or critical accessibility violation in either theme.
Screenshots go to $SWITCHYARD_SCREENSHOT_DIR (default: the test's temporary folder); docs/img/ holds two of them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_KEY, DEFAULT_MODEL, ROOT, ServerProcess

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is missing (apt-get install chromium)")

API_KEY = "console-test-api-key-42"
EMBEDDING_MODEL = "all-minilm-l6-v2"
AXE = ROOT / "tests" / "e2e" / "vendor" / "axe-core" / "axe.min.js"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 120_000  # two cores shared with other work: generous waits, never sleeps


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server over a copy of the default repository (`.repository`), with an API key and an admin key."""
    admin_file = tmp_path_factory.mktemp("console-keys") / "admin"
    admin_file.write_text(ADMIN_KEY + "\n")
    repository = tmp_path_factory.mktemp("console-repo") / "model_repository"  # a copy: a test adds a folder
    shutil.copytree(ROOT / "model_repository", repository)
    proc = ServerProcess(
        repository,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--admin-key-file",
        str(admin_file),
        "--api-key",
        API_KEY,
    )
    proc.repository = repository  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("SWITCHYARD_SCREENSHOT_DIR") or tmp_path_factory.mktemp("console-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright  # the `dev` extra; only the browser may be missing

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh --user-data-dir
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1366, "height": 900},
        )
        context.set_default_timeout(TIMEOUT_MS)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser_context: Any, console_server: ServerProcess) -> Iterator[Any]:
    """The console, opened and given the API key through its dialog (the server requires one)."""
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # Console errors other than the refused calls the tests provoke (a CSP violation would show here).
    page.on(
        "console",
        lambda m: m.type == "error" and not m.text.startswith("Failed to load resource") and errors.append(m.text),
    )
    page.goto(console_server.base_url + "/")
    dialog = page.locator("#key-dialog")
    dialog.wait_for(state="visible")
    dialog.get_by_role("textbox", name="API key").fill(API_KEY)
    dialog.get_by_role("button", name="Use key").click()
    page.locator(f'#models-table tr[data-model="{DEFAULT_MODEL}"][data-state="ready"]').wait_for()
    yield page
    page.close()
    assert not errors, f"the page raised or logged errors: {errors}"


def open_tab(page: Any, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()


def test_page_needs_no_key_but_its_data_does(console_server: ServerProcess) -> None:
    assert httpx.get(console_server.base_url + "/").status_code == 200
    assert httpx.get(console_server.base_url + "/ui/api/overview").status_code == 401


def test_overview_lists_the_repository(page: Any, shots: Path) -> None:
    rows = page.locator("#models-table tbody tr")
    names = rows.evaluate_all("rows => rows.map(r => r.dataset.model)")
    assert {DEFAULT_MODEL, EMBEDDING_MODEL, "circle_classifier"} <= set(names)
    llm = page.locator(f'#models-table tr[data-model="{DEFAULT_MODEL}"]')
    assert "pytorch" in llm.inner_text() and "float32" in llm.inner_text() and "8,192 tokens" in llm.inner_text()
    assert "CPUs" in page.locator("#fact-cpu").inner_text()
    page.screenshot(path=str(shots / "console-overview.png"))


def test_chat_streams_the_answer(page: Any, shots: Path) -> None:
    open_tab(page, "Playground")
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Max tokens").fill("40")
    page.get_by_label("System prompt").fill("You are a helpful assistant.")
    conversation = page.locator("#chat-log")
    composer = page.locator("#chat-form")
    before = (conversation.bounding_box(), composer.bounding_box())
    # Count the streamed updates of the answer and watch the layout while it streams.
    page.evaluate("""() => {
        window.__updates = 0; window.__moved = [];
        const log = document.querySelector('#chat-log'), form = document.querySelector('#chat-form');
        const box = (e) => JSON.stringify(e.getBoundingClientRect());
        const start = [box(log), box(form)];
        new MutationObserver(() => {
            window.__updates++;
            const now = [box(log), box(form)];
            if (now[0] !== start[0] || now[1] !== start[1]) window.__moved.push(now);
        }).observe(log, {subtree: true, childList: true, characterData: true});
    }""")
    page.get_by_label("Message").fill("What is the capital of France?")
    page.get_by_role("button", name="Send").click()
    answer = page.locator(".message.assistant").last
    page.wait_for_function(
        "() => !document.querySelector('.message.assistant.streaming') && "
        "document.querySelector('#chat-stats').textContent.includes('completion')"
    )
    assert "Paris" in answer.inner_text()
    stats = page.locator("#chat-stats").inner_text()
    assert "TTFT" in stats and "prompt" in stats and "completion tokens" in stats, stats
    assert page.evaluate("window.__updates") > 3, "the answer arrived in one piece, not streamed"
    assert page.evaluate("window.__moved") == [], "the conversation or the composer moved while streaming"
    assert (conversation.bounding_box(), composer.bounding_box()) == before
    page.screenshot(path=str(shots / "console-chat.png"))

    # A second turn in a KV session: the server reports the cached prompt tokens.
    page.get_by_label("Keep a KV session").check()
    page.get_by_label("Message").fill("And of Italy?")
    page.get_by_role("button", name="Send").click()
    page.wait_for_function(
        "() => document.querySelectorAll('.message.assistant').length === 2 && "
        "!document.querySelector('.message.assistant.streaming')"
    )
    assert "Session console-" in page.locator("#chat-session-id").inner_text()


def test_chart_updates_after_traffic(page: Any, console_server: ServerProcess, shots: Path) -> None:
    open_tab(page, "Live metrics")
    page.get_by_label("Refresh every").select_option("1000")
    chart = page.locator("#chart-tokens")
    page.wait_for_function("() => Number(document.querySelector('#chart-tokens').dataset.points) >= 2")
    headers = {"authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=console_server.base_url, headers=headers, timeout=120) as client:
        for _ in range(3):
            r = client.post(
                "/v1/completions",
                json={"model": DEFAULT_MODEL, "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0},
            )
            assert r.status_code == 200, r.text
    page.wait_for_function("() => Number(document.querySelector('#chart-tokens').dataset.last) > 0")
    page.wait_for_function("() => document.querySelector('#chart-ttft .chart-now').textContent.includes('p50')")
    assert "tok/s" in chart.locator(".chart-now").inner_text()
    page.screenshot(path=str(shots / "console-metrics.png"))
    page.get_by_role("button", name="Dark theme").click()
    page.wait_for_function("() => document.documentElement.dataset.theme === 'dark'")
    page.screenshot(path=str(shots / "console-metrics-dark.png"))
    page.get_by_role("button", name="Light theme").click()


def _row(page: Any, name: str) -> Any:
    return page.locator(f'#admin-table tr[data-model="{name}"]')


def test_admin_unload_and_load_the_embedding_model(page: Any, console_server: ServerProcess, shots: Path) -> None:
    open_tab(page, "Admin")
    row = _row(page, EMBEDDING_MODEL)
    row.get_by_role("button", name=f"Unload {EMBEDDING_MODEL}").click()  # no admin key yet
    refused = page.locator("#admin-log li").first
    refused.wait_for()
    assert "Refused" in refused.inner_text() and "401" in refused.inner_text(), refused.inner_text()
    page.get_by_label("Admin key").fill("not-the-admin-key")
    page.get_by_role("button", name="Use key").click()
    row.get_by_role("button", name=f"Unload {EMBEDDING_MODEL}").click()
    page.wait_for_function("() => document.querySelectorAll('#admin-log li').length === 2")
    assert "Refused" in page.locator("#admin-log li").first.inner_text()
    assert page.locator(f'#admin-table tr[data-model="{EMBEDDING_MODEL}"][data-state="ready"]').count() == 1
    assert page.get_by_label("Admin key").input_value() == ""  # the field is cleared once the key is taken
    assert "key" not in page.url.lower()

    page.get_by_label("Admin key").fill(ADMIN_KEY)
    page.get_by_role("button", name="Use key").click()
    row.get_by_role("button", name=f"Unload {EMBEDDING_MODEL}").click()
    page.locator(f'#admin-table tr[data-model="{EMBEDDING_MODEL}"][data-state="unloaded"]').wait_for()
    page.locator(f'#models-table tr[data-model="{EMBEDDING_MODEL}"][data-state="unloaded"]').wait_for(state="attached")
    assert "OK" in page.locator("#admin-log li").first.inner_text()
    assert ADMIN_KEY not in page.url
    headers = {"authorization": f"Bearer {API_KEY}"}
    r = httpx.post(
        console_server.base_url + "/v1/embeddings", headers=headers, json={"model": EMBEDDING_MODEL, "input": "x"}
    )
    assert r.status_code == 404, r.text
    page.screenshot(path=str(shots / "console-admin.png"))

    row.get_by_role("button", name=f"Load {EMBEDDING_MODEL}", exact=True).click()
    page.locator(f'#admin-table tr[data-model="{EMBEDDING_MODEL}"][data-state="ready"]').wait_for()
    r = httpx.post(
        console_server.base_url + "/v1/embeddings", headers=headers, json={"model": EMBEDDING_MODEL, "input": "x"}
    )
    assert r.status_code == 200, r.text


def test_a_failed_load_shows_its_error(page: Any, console_server: ServerProcess) -> None:
    broken = console_server.repository / "broken-llm"  # type: ignore[attr-defined]
    broken.mkdir()
    (broken / "config.yaml").write_text("backend: pytorch\nmax_model_len: 4\n")  # below the minimum of 16
    open_tab(page, "Admin")
    page.get_by_label("Admin key").fill(ADMIN_KEY)
    page.get_by_role("button", name="Use key").click()
    row = _row(page, "broken-llm")
    row.get_by_role("button", name="Load broken-llm", exact=True).click()
    page.locator('#admin-table tr[data-model="broken-llm"][data-state="failed"]').wait_for()
    result = page.locator("#admin-log li").first
    assert "Refused" in result.inner_text() and "400" in result.inner_text() and "max_model_len" in result.inner_text()
    assert "max_model_len" in row.locator(".reason").inner_text()
    assert str(console_server.repository) not in row.inner_text()  # type: ignore[attr-defined]
    assert page.locator('#models-table tr[data-model="broken-llm"]').get_attribute("data-state") == "failed"


def test_embeddings_and_v2_tabs(page: Any) -> None:
    open_tab(page, "Playground")
    page.get_by_role("tab", name="Embeddings").click()
    page.locator(f'#embed-model option[value="{EMBEDDING_MODEL}"]').wait_for(state="attached")
    page.locator("#embed-model").select_option(EMBEDDING_MODEL)
    page.get_by_role("button", name="Embed").click()
    page.get_by_role("heading", name="Similarity").wait_for()
    assert "384" in page.locator("#embed-result").inner_text()

    page.get_by_role("tab", name="Rerank").click()  # shown because the server serves /v1/rerank
    page.locator("#rerank-model").select_option(EMBEDDING_MODEL)
    page.locator("#rerank-form").get_by_role("button", name="Rerank").click()
    first = page.locator("#rerank-result tbody tr").first
    first.wait_for()
    assert "Paris is the capital of France." in first.inner_text()

    page.get_by_role("tab", name="v2 infer").click()
    page.locator("#v2-model").select_option("circle_classifier")
    page.locator('#v2-inputs fieldset[data-input="FEATURES"]').wait_for()
    assert '"FEATURES"' in page.locator("#v2-request").inner_text()
    page.get_by_role("button", name="Infer").click()
    page.wait_for_function("() => document.querySelector('#v2-response').textContent.includes('PROBABILITIES')")


def test_phone_layout_has_no_horizontal_scroll(page: Any, shots: Path) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    for tab in ("Overview", "Live metrics", "Playground", "Admin"):
        open_tab(page, tab)
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 391, f"{tab}: the page is {width}px wide on a 390px screen"
    open_tab(page, "Playground")
    page.screenshot(path=str(shots / "console-phone.png"))


def _axe(page: Any) -> list[dict[str, Any]]:
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.evaluate(AXE.read_text())  # evaluated over DevTools: the page's CSP does not apply
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [v for v in result["violations"] if v["impact"] in ("serious", "critical")]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_accessibility(page: Any, theme: str) -> None:
    if page.evaluate("() => document.documentElement.dataset.theme") != theme:
        page.get_by_role("button", name=f"{theme.title()} theme").click()
    found = {}
    for tab, sub in (
        ("Overview", None),
        ("Live metrics", None),
        ("Playground", "Chat"),
        ("Playground", "Embeddings"),
        ("Playground", "v2 infer"),
        ("Admin", None),
    ):
        open_tab(page, tab)
        if sub:
            page.get_by_role("tab", name=sub, exact=True).click()
        for v in _axe(page):
            found[f"{tab}/{sub or ''}: {v['id']}"] = [n["target"] for n in v["nodes"]][:5]
    assert not found, found
