#!/usr/bin/env python3
"""Drives the web console (`GET /console`, issue 56 point 5) in headless Chromium against a
real shop, and keeps screenshots of its pages in docs/console/.

It starts the shop with bearer tokens (admin and read), places orders over HTTP, then
through the page: the sign-in prompt without a token (and no data), the cluster's
partitions, the views and process managers with their real state, a view query with a
second page, an order's history with an event arriving live after a command sent over plain
HTTP, a command sent from the form (200 and the new version), and a read-role token's 403
on the command form. Any failed check, any error the page logs (a Content-Security-Policy
violation, a script error) exits non-zero.

Installs what it uses: Debian's `chromium` (apt-get, when /usr/bin/chromium is missing) and
Playwright for Python (pinned below) into a venv under ~/.cache/eventfold; Playwright's own
browser download is never used.

Usage: scripts/console_test.py --bin target/debug [--shots docs/console] [--keep]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from shop_process import free_port, token_file, wait_ready

ROOT = Path(__file__).resolve().parent.parent
PLAYWRIGHT = "playwright==1.49.1"
VENV = Path(os.environ.get("EVENTFOLD_CACHE", Path.home() / ".cache" / "eventfold")) / "venv-console"
CHROMIUM = "/usr/bin/chromium"
# Test credentials, generated per run.
ADMIN = uuid.uuid4().hex
READER = uuid.uuid4().hex
# The orders the query pages through: five of one customer, more than one page of two.
CUSTOMER = "c-console"
ORDERS = [f"o-{i}" for i in range(1, 6)]
TIMEOUT_MS = 15_000


def log(msg: str) -> None:
    print(f"[console] {msg}", file=sys.stderr, flush=True)


def ensure_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    log("installing Debian's chromium (apt-get)")
    subprocess.run(["apt-get", "update", "-q"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def ensure_playwright() -> Path:
    """The venv's python, with Playwright installed (re-running this script inside it)."""
    python = VENV / "bin" / "python"
    ok = python.exists() and subprocess.run([str(python), "-c", "import playwright"],
                                            capture_output=True).returncode == 0
    if not ok:
        log(f"installing {PLAYWRIGHT} into {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", PLAYWRIGHT],
                       check=True)
    return python


def call(base: str, method: str, path: str, token: str | None, body: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def seed(base: str) -> None:
    for i, order in enumerate(ORDERS + ["o-other"]):
        customer = CUSTOMER if order != "o-other" else "c-other"
        status, body = call(base, "POST", f"/v1/aggregates/order/{order}/commands", ADMIN, {
            "type": "PlaceOrder", "customer_id": customer,
            "items": [{"sku": f"sku-{i}", "qty": 1 + i, "price_cents": 250}]})
        if status != 200:
            raise SystemExit(f"placing {order}: {status} {body}")
    # The query must see them: wait until the orders view has applied the last write.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = call(base, "GET", f"/v1/views/orders?customer_id={CUSTOMER}&limit=100", ADMIN)
        if status == 200 and len(body["rows"]) == len(ORDERS):
            return
        time.sleep(0.2)
    raise SystemExit(f"the orders view did not show the {len(ORDERS)} orders: {status} {body}")


class Checks:
    """Collects failures instead of stopping at the first, so one run shows them all."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def that(self, ok: bool, what: str) -> None:
        log(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            self.failures.append(what)


def drive(base: str, shots: Path) -> list[str]:
    from playwright.sync_api import sync_playwright, expect

    checks = Checks()
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        ctx = browser.new_context(viewport={"width": 1280, "height": 860})
        ctx.set_default_timeout(TIMEOUT_MS)
        page = ctx.new_page()
        page_errors: list[str] = []
        page.on("pageerror", lambda e: page_errors.append(f"script error: {e}"))
        # Chromium logs every 4xx a fetch gets; those this test provokes are expected.
        expected = re.compile(r"^Failed to load resource: the server responded with a status of (401|403|412) ")
        page.on("console", lambda m: page_errors.append(f"console {m.type}: {m.text}")
                if m.type == "error" and not expected.match(m.text) else None)
        api_calls: list[str] = []
        page.on("request", lambda r: api_calls.append(r.url) if "/v1/" in r.url else None)

        def step(what: str, fn) -> None:
            try:
                fn()
                checks.that(True, what)
            except Exception as e:  # noqa: BLE001 - any failure of a step is reported
                checks.that(False, f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")

        def shot(name: str) -> None:
            page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

        # Without a token: the sign-in prompt, and no data on the page.
        def signed_out() -> None:
            page.goto(f"{base}/console#/cluster")
            expect(page.locator("#sign-in")).to_be_visible()
            expect(page.locator("#page")).to_be_hidden()
            assert page.locator("#partitions").count() == 0, "partition rows shown without a token"
            assert "o-1" not in page.content()
        step("without a token: the sign-in prompt and no data", signed_out)
        shot("sign-in")

        def sign_in() -> None:
            page.fill("#token", ADMIN)
            page.click("#sign-in-form button")
            expect(page.locator("#sign-in")).to_be_hidden()
            expect(page.locator("#who-text")).to_have_text("signed in with a token")
        step("signing in with the admin token", sign_in)

        def cluster() -> None:
            page.goto(f"{base}/console#/cluster")
            rows = page.locator("#partitions tbody tr")
            expect(rows.first).to_be_visible()
            for ty in ("order", "payment", "customer"):
                for part in ("0", "1"):
                    row = page.locator(f"#partitions tr[data-aggregate='{ty}'][data-partition='{part}']")
                    expect(row).to_contain_text("ready")
                    expect(row).to_contain_text("local")
        step("cluster page: every partition of order, payment and customer, ready, owned here", cluster)
        shot("cluster")

        def views() -> None:
            page.goto(f"{base}/console#/views")
            orders = page.locator("#view-table tr[data-view='orders']")
            expect(orders).to_contain_text("ready")
            expect(orders).to_contain_text("customer_id (string)")
            expect(orders).to_contain_text("total_cents (number)")
            expect(page.locator("#view-table tr[data-view='customers']")).to_contain_text("email (string, unique)")
            # Real offsets: the orders view has applied the six orders placed (over 2 partitions).
            applied = orders.locator("td").nth(7).inner_text()
            total = sum(int(n) for n in re.findall(r"p\d+: (\d+)", applied))
            assert total == len(ORDERS) + 1, f"applied offsets {applied!r} sum to {total}, not {len(ORDERS) + 1}"
            for pm in ("order_flow", "customer_orders"):
                expect(page.locator(f"#process-table tr[data-process-manager='{pm}']")).to_contain_text("ready")
        step("views page: the shop's views and process managers with their state, offsets and indexes", views)
        shot("views")

        def query() -> None:
            page.goto(f"{base}/console#/query")
            page.select_option("#q-view", "orders")
            page.select_option("#q-index", "customer_id")
            page.select_option("#q-op", "eq")
            page.fill("#q-value", CUSTOMER)
            page.fill("#q-limit", "2")
            page.click("#q-run")
            expect(page.locator("#q-summary")).to_have_text("Page 1: 2 rows.")
            first = page.locator("#rows tbody tr").evaluate_all("rs => rs.map(r => r.dataset.key)")
            shot("query")
            page.click("#q-next")
            expect(page.locator("#q-summary")).to_have_text("Page 2: 2 rows.")
            second = page.locator("#rows tbody tr").evaluate_all("rs => rs.map(r => r.dataset.key)")
            page.click("#q-next")
            expect(page.locator("#q-summary")).to_have_text("Page 3: 1 rows.")
            expect(page.locator("#q-last")).to_be_visible()
            third = page.locator("#rows tbody tr").evaluate_all("rs => rs.map(r => r.dataset.key)")
            seen = first + second + third
            assert sorted(seen) == sorted(ORDERS), f"pages gave {seen}, expected the orders {ORDERS}"
            expect(page.locator("#rows")).to_contain_text(CUSTOMER)
        step("query page: orders by customer_id, two rows a page, three pages with every order once", query)

        def history() -> None:
            page.goto(f"{base}/console#/history?type=order&id=o-1")
            expect(page.locator("#h-live")).to_have_text("● live")
            expect(page.locator("#events tr[data-version='1']")).to_contain_text("OrderPlaced")
            expect(page.locator("#h-version")).to_have_text("version 1")
            status, body = call(base, "POST", "/v1/aggregates/order/o-1/commands", ADMIN, {"type": "ConfirmOrder"})
            assert status == 200, f"ConfirmOrder over HTTP: {status} {body}"
            live = page.locator("#events tr[data-version='2']")
            expect(live).to_contain_text("OrderConfirmed")
            expect(live).to_have_class("fresh")
            # The order flow pays and ships a confirmed order: its command arrives live too.
            expect(page.locator("#events tr[data-version='3']")).to_contain_text("OrderShipped")
            expect(page.locator("#h-version")).to_have_text("version 3")
            expect(page.locator("#h-state-doc")).to_contain_text("shipped")
        step("history page: o-1's event, then a command over plain HTTP and the order flow's ShipOrder appear live",
             history)
        shot("history")

        def command() -> None:
            page.goto(f"{base}/console#/command")
            page.select_option("#c-type", "order")
            page.fill("#c-id", "o-2")
            page.fill("#c-body", '{"type": "AddItem", "sku": "sku-console", "qty": 3, "price_cents": 99}')
            page.fill("#c-key", "console-add-1")
            page.fill("#c-if-match", "1")
            page.click("#c-send")
            expect(page.locator("#c-status")).to_have_attribute("data-status", "200")
            expect(page.locator("#c-status")).to_contain_text("at version 2")
            expect(page.locator("#c-answer")).to_contain_text("ItemAdded")
            status, body = call(base, "GET", "/v1/aggregates/order/o-2", ADMIN)
            assert status == 200 and body["version"] == 2, f"o-2 after the form's command: {status} {body}"
        step("command page: AddItem on o-2 answers 200 with version 2", command)
        shot("command")

        def stale_version() -> None:
            page.click("#c-send")  # same If-Match "1", new state is 2; the key repeats: the original outcome
            expect(page.locator("#c-status")).to_have_attribute("data-status", "200")
            page.fill("#c-key", "console-add-2")
            page.click("#c-send")
            expect(page.locator("#c-status")).to_have_attribute("data-status", "412")
        step("command page: the same Idempotency-Key answers the original 200, a stale If-Match 412", stale_version)

        # A read-role token: the pages load, the command form shows 403 forbidden.
        reader = browser.new_context(viewport={"width": 1280, "height": 700})
        reader.set_default_timeout(TIMEOUT_MS)
        rpage = reader.new_page()

        def read_role() -> None:
            rpage.goto(f"{base}/console#/command")
            rpage.fill("#token", READER)
            rpage.click("#sign-in-form button")
            rpage.select_option("#c-type", "order")
            rpage.fill("#c-id", "o-3")
            rpage.fill("#c-body", '{"type": "ConfirmOrder"}')
            rpage.click("#c-send")
            expect(rpage.locator("#c-status")).to_have_attribute("data-status", "403")
            expect(rpage.locator("#c-status")).to_contain_text("forbidden")
            status, body = call(base, "GET", "/v1/aggregates/order/o-3", ADMIN)
            assert status == 200 and body["version"] == 1, f"o-3 changed by a read token: {body}"
        step("a read-role token: the command form shows 403 forbidden and nothing is written", read_role)
        rpage.screenshot(path=str(shots / "command-forbidden.png"), full_page=True)

        def read_role_cluster() -> None:
            rpage.goto(f"{base}/console#/cluster")
            expect(rpage.locator("#cluster .error")).to_contain_text("403 forbidden")
            rpage.goto(f"{base}/console#/views")
            expect(rpage.locator("#view-table tr[data-view='orders']")).to_contain_text("ready")
        step("a read-role token: the cluster page shows 403, the views page loads", read_role_cluster)

        def sign_out() -> None:
            page.goto(f"{base}/console#/views")
            expect(page.locator("#view-table")).to_be_visible()
            page.click("#sign-out")
            expect(page.locator("#sign-in")).to_be_visible()
            expect(page.locator("#page")).to_be_hidden()
            assert page.locator("#view-table").count() == 0
        step("signing out hides the data and shows the sign-in prompt", sign_out)

        checks.that(not page_errors, f"the page logged no errors: {page_errors}")
        checks.that(any("/v1/views/orders?" in u for u in api_calls), "the query went through the API from the page")
        browser.close()
    return checks.failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, default=ROOT / "target" / "debug",
                    help="directory holding the shop binary (default target/debug)")
    ap.add_argument("--shots", type=Path, default=ROOT / "docs" / "console",
                    help="where the screenshots go (default docs/console)")
    ap.add_argument("--keep", action="store_true", help="keep the shop's data directory and log")
    ap.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.in_venv:
        ensure_chromium()
        python = ensure_playwright()
        return subprocess.run([str(python), __file__, "--in-venv", "--bin", str(args.bin), "--shots", str(args.shots)]
                              + (["--keep"] if args.keep else [])).returncode

    shop = args.bin / "shop"
    if not shop.exists():
        raise SystemExit(f"no shop binary at {shop} (cargo build -p shop)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data = Path(tempfile.mkdtemp(prefix="eventfold-console-"))
    cmd = [str(shop), "--http", f"127.0.0.1:{port}", "--data-dir", str(data / "shop"), "--partitions", "2",
           "--auth-tokens", str(token_file(shop, data, [("console-admin", "admin", ADMIN), ("console-reader", "read", READER)]))]
    log(f"starting {' '.join(cmd)}")
    shop_log = open(data / "shop.log", "wb")
    proc = subprocess.Popen(cmd, stdout=shop_log, stderr=subprocess.STDOUT)
    failures = ["not run"]
    try:
        wait_ready(base, proc)
        seed(base)
        failures = drive(base, args.shots)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        if failures or args.keep:
            log(f"the shop's log: {data / 'shop.log'}")
        else:
            shutil.rmtree(data, ignore_errors=True)
    if failures:
        log(f"{len(failures)} check(s) failed: {failures}")
        return 1
    log(f"all checks passed; screenshots in {args.shots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
