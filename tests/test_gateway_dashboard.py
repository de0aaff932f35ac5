"""/dashboard in a real headless browser (Debian's chromium driven by Playwright) against the live gateway
with API keys enabled: the page asks for a key, shows live numbers that change as requests are served,
and logs no console error. /v1/stats itself is checked over HTTP."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gateway_fixtures import API_KEY, LiveStack, live  # noqa: F401  (the session's live server)

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def test_stats_needs_the_key_and_counts_requests(live: LiveStack) -> None:  # noqa: F811
    assert httpx.get(f"{live.url}/v1/stats").status_code == 401
    headers = {"Authorization": f"Bearer {API_KEY}"}
    before = httpx.get(f"{live.url}/v1/stats", headers=headers).json()
    live.client().chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    httpx.post(f"{live.url}/v1/chat/completions", headers=headers, json={"model": "no-such-model", "messages": []})
    after = httpx.get(f"{live.url}/v1/stats", headers=headers).json()
    assert after["requests"]["total"] >= before["requests"]["total"] + 2
    assert after["ttft_s"]["count"] >= 1 and after["latency_s"]["p50"] is not None
    assert after["keys"]["…" + API_KEY[-4:]]["requests"] >= 2
    assert any(e["status"] >= 400 and e["model"] in ("", "no-such-model") for e in after["recent_errors"])
    engine = after["engine"]
    assert engine["kv_blocks_total"] > 0 and 0.0 <= engine["kv_usage"] <= 1.0
    assert after["process"]["rss_bytes"] > 0
    page = httpx.get(f"{live.url}/dashboard")  # the page itself holds no data: served without a key
    assert page.status_code == 200 and 'content="required"' in page.text
    assert httpx.get(f"{live.url}/dashboard/dashboard.js").headers["content-type"].startswith("text/javascript")


@pytest.fixture()
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("no chromium binary (make test installs Debian's chromium with apt-get when it can)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
    with sync_api.sync_playwright() as pw:
        # Playwright's own browser download needs the internet: drive the system chromium instead.
        # --no-sandbox: the sandbox refuses to run as root (CI containers).
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


def _expect() -> Any:
    """Playwright's locator assertions: they wait without evaluating strings (the page's CSP forbids eval)."""
    from playwright.sync_api import expect

    expect.set_options(timeout=60_000)  # the machine is shared: be patient with the browser
    return expect


def _watch_console(page: Any) -> list[str]:
    page.set_default_timeout(60_000)  # the machine is shared: be patient with the browser
    problems: list[str] = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    return problems


def test_dashboard_shows_live_numbers_in_a_real_browser(live: LiveStack, browser: Any) -> None:  # noqa: F811
    page = browser.new_page()
    problems = _watch_console(page)
    page.goto(f"{live.url}/dashboard")
    expect = _expect()
    expect(page.locator("#status")).to_have_text("admin key required")
    page.fill("#key", API_KEY)
    page.click("#auth button")
    expect(page.locator("#status")).to_have_text(re.compile(r"^live"))
    total = page.text_content('[data-stat="requests.total"]')
    client = live.client()
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Count to five."}], max_tokens=8)
    for _ in client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, stream=True
    ):
        pass
    expect(page.locator('[data-stat="requests.total"]')).not_to_have_text(total)
    assert page.text_content('[data-stat="ttft_s.p50"]').endswith(" ms")
    assert page.text_content('[data-stat="engine.kv_blocks_total"]') not in ("", "–")
    assert "…" + API_KEY[-4:] in page.text_content("#keys")
    assert live.engine.model_name in page.text_content("#models")
    assert problems == []
    if shot := os.environ.get("SMOLGATE_DASHBOARD_SCREENSHOT"):  # the README's picture: set it to a .png path
        page.set_viewport_size({"width": 1280, "height": 900})
        page.wait_for_timeout(1500)
        page.screenshot(path=shot, full_page=True)


def test_dashboard_with_a_wrong_key_asks_again(live: LiveStack, browser: Any) -> None:  # noqa: F811
    page = browser.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{live.url}/dashboard#key=sk-wrong")
    _expect()(page.locator("#status")).to_have_text("admin key rejected")
    assert page.is_visible("#key")
    assert "#key" not in page.url  # the key never stays in the address bar
