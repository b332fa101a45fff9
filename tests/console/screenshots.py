"""Screenshots of the console's pages in a real browser, for a person to look at (issue 33).

Not a test (pytest collects only ``test_*.py``). It builds, in a temporary
ledger, a run whose task failed twice before it succeeded, a failed run, a
500-task fan-out and an agent run on the mock model; serves ``pipeline console``
on 127.0.0.1; and saves full-page PNGs of their pages, seen in Debian's
chromium driven by Playwright, into the folder given::

    .venv/bin/python tests/console/screenshots.py /work/screenshots
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.console.conftest import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    FLOWS,
    run_flow,
    start_console,
)
from tests.console.test_console_browser_debug import AGENT_FLOW  # noqa: E402


def main(out: Path) -> list[Path]:
    """Build the runs, serve the console, write the PNGs into ``out``; their paths."""
    from playwright.sync_api import expect, sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="ledgerflow-shots-") as tmp_s:
        tmp = Path(tmp_s)
        flow = tmp / "flows.py"
        flow.write_text(FLOWS)
        agents = tmp / "agents.py"
        agents.write_text(AGENT_FLOW)
        ledger = str(tmp / "ledger.duckdb")
        retried = run_flow(flow, "demo", ledger, "-p", "n=5")
        failed = run_flow(flow, "broken", ledger)
        big = run_flow(flow, "demo", ledger, "-p", "n=500")
        agent = run_flow(agents, "agent_flow", ledger, "--executor", "inline")
        con = start_console(ledger, tmp / "console.log", "--allow-actions")
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 900})

                def shot(name: str) -> None:
                    path = out / name
                    page.screenshot(path=str(path), full_page=True)
                    saved.append(path)

                page.goto(con.url)
                expect(page.locator("#runs tbody tr")).to_have_count(4, timeout=30_000)
                shot("runs.png")

                page.goto(con.url.replace("/?", f"/runs/{retried}?"))
                page.locator('#timeline rect.attempt[data-task="flaky"][data-attempt="1"]'
                             ).click()
                expect(page.locator('#inspector details.traceback[data-attempt="1"] pre')
                       ).to_contain_text("ValueError")
                expect(page.locator("#inspector")).not_to_contain_text("loading…",
                                                                        timeout=20_000)
                shot("failed-attempt.png")

                page.goto(con.url.replace("/?", f"/runs/{failed}?"))
                expect(page.locator("#graph svg")).to_be_visible(timeout=20_000)
                shot("failed-run.png")

                page.goto(con.url.replace("/?", f"/runs/{big}?"))
                expect(page.locator("#graph svg#graph-svg")).to_be_visible(timeout=20_000)
                page.locator('#graph g.node[data-key="square"]').click()
                expect(page.locator("#item-rows tbody tr")).to_have_count(100,
                                                                        timeout=20_000)
                shot("fan-out-500.png")

                page.goto(con.url.replace("/?", f"/runs/{agent}?"))
                calls = page.locator("#usage details.call")
                expect(calls).to_have_count(5, timeout=20_000)
                for i in range(calls.count()):
                    calls.nth(i).locator("summary").click()
                shot("agent-run.png")
                browser.close()
        finally:
            con.stop()
    return saved


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: screenshots.py FOLDER", file=sys.stderr)
        sys.exit(2)
    for p in main(Path(sys.argv[1])):
        print(p)
