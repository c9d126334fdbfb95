"""The web console's browser tests: Debian's chromium, driven by Playwright, against a running
`sluice dev` (started by scripts/suites/console.sh with admin, operator and agent tokens) and
the demo upstream, whose bank is made to misbehave to leave a wire STUCK.

Each test drives the console as a person would (sign in, find, click, type a reason) and then
checks the result through the API as well, so a console that only looks right fails. Ends
with one line `N passed, N failed, N skipped`; screenshots of every view go to --shots.
"""

import argparse
import base64
import glob
import hashlib
import hmac
import json
import os
import re
import sqlite3
import sys
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request

from playwright.sync_api import expect, sync_playwright

TOKENS = {
    "admin": "console-admin-token-0123456789",
    "operator": "console-operator-token-0123456789",
    "agent-a": "console-agent-a-token-0123456789",
    "agent-b": "console-agent-b-token-0123456789",
}
WIRE = "payments/wire"
TIMEOUT_MS = 20_000

ARGS = None


# --- The API, for setting up scenarios and checking what the console did ------------------


def call(method, path, token=None, body=None, base=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request((base or ARGS.base) + path, data=data, method=method)
    request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=40) as response:
            text = response.read().decode()
            try:
                parsed = json.loads(text) if text else None
            except ValueError:
                parsed = text
            return response.status, parsed, dict(response.headers)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        return e.code, parsed, dict(e.headers)


def key_path(run, key):
    return f"/v1/runs/{run}/effects/{urllib.parse.quote(key, safe='')}"


def submit(agent, run, decision, tool, args, wait=True, **extra):
    body = {"run_id": run, "decision": decision, "tool": tool, "call_idx": 0, "args": args, **extra}
    headers = {"prefer": "wait=30"} if wait else {}
    status, answer, _ = call("POST", "/v1/effects", TOKENS[agent], body, headers=headers)
    assert status in (200, 201, 202), f"submit {run} {tool}: {status} {answer}"
    return answer


def command(run, key):
    status, answer, _ = call("GET", key_path(run, key), TOKENS["admin"])
    assert status == 200, f"{run}/{key}: {status} {answer}"
    return answer


def wait_for(run, key, statuses, seconds=60):
    deadline = time.time() + seconds
    while True:
        found = command(run, key)
        if found["status"] in statuses:
            return found
        if time.time() > deadline:
            raise AssertionError(f"{run}/{key} is {found['status']}, not {statuses}")
        time.sleep(0.2)


def set_faults(faults):
    status, answer, _ = call("POST", "/_faults", body=faults, base=ARGS.upstream)
    assert status == 200, f"faults: {status} {answer}"


def wire(account, amount):
    return {"account": account, "amount_minor": amount, "beneficiary": "b-9", "date": "2026-11-25"}


def email(to="ops@example.com"):
    return {"to": to, "subject": "paid", "body": "wire sent"}


def seed():
    """The runs the tests work on: one STUCK, two BLOCKED, one to roll back, and others."""
    # The bank commits and answers 500, its lookups answer 503: the wire cannot be settled from
    # evidence. The mail service answers 503 to every send: retried with its key until STUCK.
    set_faults({"bank": {"commit_then_5xx": 1.0}, "email": {"error_5xx": 1.0},
                "status_inconclusive": 1.0})
    stuck = submit("agent-a", "r-stuck", 1, WIRE, wire("acc-stuck", 5_000), wait=False)
    retry = submit("agent-a", "r-retry", 1, "email/send", email("retry@example.com"), wait=False)
    wait_for("r-stuck", stuck["command_key"], {"STUCK"}, seconds=90)
    wait_for("r-retry", retry["command_key"], {"STUCK"}, seconds=90)
    set_faults({})
    submit("agent-a", "r-blocked", 1, WIRE, wire("acc-big", 2_000_000))
    submit("agent-a", "r-blocked-2", 1, WIRE, wire("acc-big-2", 3_000_000))
    submit("agent-a", "r-rollback", 1, WIRE, wire("acc-rb", 7_000))
    submit("agent-a", "r-rollback", 2, "tickets/create", {"title": "refund the customer"})
    submit("agent-a", "r-rollback", 3, "email/send", email())
    submit("agent-a", "r-tamper", 1, "email/send", email("audit@example.com"))
    submit("agent-a", "r-later", 1, "email/send", email("later@example.com"), delay_ms=3_600_000)
    submit("agent-b", "r-b-private", 1, "email/send", email("b@example.com"))
    for run in ("r-rollback", "r-tamper", "r-b-private"):
        status, answer, _ = call("GET", f"/v1/runs/{run}/effects", TOKENS["admin"])
        assert status == 200
        for effect in answer["effects"]:
            wait_for(run, effect["command_key"], {"CONFIRMED"})


# --- The browser ---------------------------------------------------------------------------


def shot(page, name):
    page.screenshot(path=os.path.join(ARGS.shots, f"{name}.png"), full_page=True)


def sign_in(page, who):
    page.goto(ARGS.base + "/ui/")
    expect(page.locator("#sign-in")).to_be_visible()
    page.fill("#token", TOKENS[who])
    page.keyboard.press("Enter")
    expect(page.locator("#who")).to_be_visible()
    expect(page.locator("#who-name")).to_contain_text(f"console-{who}" if who in ("admin", "operator") else who)


def mark(page):
    """Marks the page so a later check can tell it was never reloaded."""
    page.evaluate("window.__notReloaded = true")


def not_reloaded(page):
    assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"


def in_page_fetch(page, method, path, body=None):
    """Calls the API from the page with the signed-in token, as the console does."""
    return page.evaluate(
        """async ([method, path, body]) => {
            const headers = {authorization: 'Bearer ' + sessionStorage.getItem('sluice.token'),
                             'content-type': 'application/json'};
            const r = await fetch(path, {method, headers, body: body ? JSON.stringify(body) : undefined});
            const text = await r.text();
            return {status: r.status, text};
        }""",
        [method, path, body],
    )


TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


@test
def signs_in_with_a_token_and_lists_runs(browser):
    page = browser.new_page()
    page.goto(ARGS.base + "/ui")
    expect(page.locator("#sign-in")).to_be_visible()
    shot(page, "sign-in")
    page.fill("#token", "not-a-real-token-0000000000")
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#sign-in-error")).to_contain_text("not recognised")
    sign_in(page, "admin")
    expect(page.locator("[data-role=admin]")).to_have_text("admin")
    rows = page.locator("table[aria-label=Runs] tbody tr")
    expect(page.locator("tr[data-run=r-stuck]")).to_be_visible()
    assert rows.count() >= 8, rows.count()
    expect(page.locator("tr[data-run=r-b-private]")).to_contain_text("agent-b")
    # Counts by status, told apart by text and icon, not colour alone.
    stuck_chip = page.locator("[data-count-status=STUCK]")
    expect(stuck_chip).to_contain_text("STUCK")
    expect(stuck_chip).to_contain_text("⚠")
    # Timestamps in local time, UTC on hover.
    title = page.locator("tr[data-run=r-stuck] time").first.get_attribute("title")
    assert title.endswith("Z (UTC)"), title
    shot(page, "runs")
    # Filter by status, then search by command key.
    stuck_chip.click()
    expect(page.locator("tr[data-run=r-stuck]")).to_be_visible()
    expect(page.locator("tr[data-run=r-rollback]")).to_have_count(0)
    page.goto(ARGS.base + "/ui/#/runs?q=d-3/email")
    expect(page.locator("tr[data-run=r-rollback]")).to_be_visible()
    expect(page.locator("tr[data-run=r-stuck]")).to_have_count(0)
    page.goto(ARGS.base + "/ui/#/runs?tool=tickets/create")
    expect(page.locator("tr[data-run=r-rollback]")).to_be_visible()
    expect(page.locator("tr[data-run=r-tamper]")).to_have_count(0)
    page.close()


def held(status):
    """How many effects are in `status` now, by the API's listing."""
    code, answer, _ = call("GET", f"/v1/effects?status={status}&limit=1000", TOKENS["operator"])
    assert code == 200, answer
    return len(answer["effects"])


@test
def shows_the_overview_charts_from_the_servers_own_counters(browser):
    page = browser.new_page()
    refused = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    sign_in(page, "operator")
    # Read before the page reads: the page may count more, never less.
    _, overview, _ = call("GET", "/v1/overview", TOKENS["operator"])
    confirmed = sum(m["settled"].get("CONFIRMED", 0) for m in overview["minutes"])
    page.click("nav >> text=Overview")
    expect(page.locator("main h1")).to_contain_text("Overview")
    # The tiles hold what the server holds now; seed() left two STUCK and two BLOCKED.
    for name in ("STUCK", "BLOCKED", "UNKNOWN"):
        expect(page.locator(f"[data-held={name}] .figure")).to_have_text(str(held(name)))
    assert held("STUCK") == 2 and held("BLOCKED") == 2, (held("STUCK"), held("BLOCKED"))
    # The settled chart: one bar segment per minute and outcome, summing to the server's count.
    assert confirmed >= 5, overview  # r-rollback's three, r-tamper's, r-b-private's at least
    bars = page.locator("svg.chart rect[data-outcome=CONFIRMED]")
    expect(bars.first).to_be_visible()
    drawn = sum(int(bars.nth(i).get_attribute("data-count")) for i in range(bars.count()))
    assert drawn >= confirmed, (drawn, confirmed)
    # The held chart: a line per status, and the figures as a table for those who cannot see it.
    for series in ("UNKNOWN", "STUCK", "BLOCKED"):
        expect(page.locator(f"svg.chart polyline[data-series={series}]")).to_have_count(1)
    page.locator("details.figures summary", has_text="Effects held").click()
    now_row = page.locator("table[aria-label='Effects held'] tr[data-partial=true]")
    expect(now_row).to_contain_text("now")
    assert not refused, f"the policy refused something: {refused}"
    shot(page, "overview")
    page.close()


@test
def keeps_the_token_out_of_urls_cookies_and_lasting_storage(browser):
    context = browser
    page = context.new_page()
    seen = []
    page.on("request", lambda r: seen.append(r.url))
    sign_in(page, "admin")
    page.goto(ARGS.base + "/ui/#/run/r-rollback")
    expect(page.locator("[data-key]").first).to_be_visible()
    token = TOKENS["admin"]
    assert all(token not in url for url in seen), "a request URL holds the token"
    assert token not in page.url
    assert page.evaluate("document.cookie") == ""
    assert context.cookies() == []
    assert page.evaluate("localStorage.length") == 0
    assert page.evaluate("sessionStorage.getItem('sluice.token')") == token
    # The policy forbids inline script; the page still works, so it needs none.
    _, _, headers = call("GET", "/ui/")
    headers = {k.lower(): v for k, v in headers.items()}
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    # An injected inline script is refused by the browser, which reports the violation.
    verdict = page.evaluate(
        """() => new Promise((resolve) => {
            document.addEventListener('securitypolicyviolation',
                (e) => resolve(`blocked ${e.effectiveDirective}`), { once: true });
            const script = document.createElement('script');
            script.textContent = 'window.__inlineRan = true';
            document.head.append(script);
            setTimeout(() => resolve(window.__inlineRan ? 'ran' : 'no report'), 2000);
        })"""
    )
    assert verdict.startswith("blocked script-src"), verdict
    page.click("#sign-out")
    expect(page.locator("#sign-in")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('sluice.token')") is None
    page.close()


@test
def finds_a_stuck_effect_dry_runs_a_replay_and_resolves_it(browser):
    page = browser.new_page()
    sign_in(page, "admin")
    page.click("nav >> text=Queues")
    row = page.locator("table[aria-label='Stuck effects'] tr[data-run=r-stuck]")
    expect(row).to_be_visible()
    expect(row).to_contain_text("STUCK")
    expect(row.locator("details summary").first).to_contain_text("Timeline")
    shot(page, "queues")
    # A replay offers its dry run first; without evidence it is refused, and says why.
    row.locator("[data-action=replay]").click()
    dialog = page.locator("#action")
    expect(dialog).to_be_visible()
    expect(dialog.locator("button", has_text="Replay").last).to_be_disabled()
    dialog.locator("textarea[name=reason]").fill("see if a replay is safe")
    dialog.locator("button", has_text="Dry run").click()
    report = dialog.locator("[data-result=dry-run]")
    expect(report).to_contain_text("Dry run: nothing was called or changed")
    expect(report).to_contain_text("refused")
    expect(dialog.locator("button", has_text="Replay").last).to_be_disabled()
    shot(page, "replay-dry-run")
    dialog.locator("button", has_text="Close").click()
    assert command("r-stuck", "d-1/payments/wire/0")["status"] == "STUCK", "a dry run changed nothing"
    # Resolve with evidence.
    row.locator("[data-action=resolve]").click()
    expect(dialog).to_be_visible()
    dialog.locator("select[name=outcome]").select_option("CONFIRMED")
    dialog.locator("textarea[name=evidence]").fill("w-statement-77")
    dialog.locator("button", has_text="Resolve").click()
    expect(dialog.locator("[role=alert]")).to_contain_text("reason")
    dialog.locator("textarea[name=reason]").fill("on the bank statement")
    dialog.locator("button", has_text="Resolve").click()
    result = dialog.locator("[data-result=applied]")
    expect(result).to_contain_text("STUCK")
    expect(result).to_contain_text("CONFIRMED")
    expect(result).to_contain_text("on the bank statement")
    expect(result).to_contain_text("console-admin")
    shot(page, "resolve-result")
    dialog.locator("button", has_text="Close").click()
    resolved = command("r-stuck", "d-1/payments/wire/0")
    assert resolved["status"] == "CONFIRMED", resolved["status"]
    assert resolved["external_ref"] == "w-statement-77", resolved.get("external_ref")
    expect(page.locator("table[aria-label='Stuck effects'] tr[data-run=r-stuck]")).to_have_count(0)
    page.close()


@test
def replays_a_stuck_email_after_a_dry_run_says_it_may(browser):
    page = browser.new_page()
    sign_in(page, "admin")
    page.goto(ARGS.base + "/ui/#/run/r-retry")
    card = page.locator("details[data-key='d-1/email/send/0']")
    expect(card).to_have_attribute("data-status", "STUCK")
    expect(page.locator(".live")).to_have_attribute("data-state", "live")
    mark(page)
    card.locator("[data-action=replay]").click()
    dialog = page.locator("#action")
    replay = dialog.locator("button", has_text="Replay").last
    expect(replay).to_be_disabled()
    dialog.locator("textarea[name=reason]").fill("mail service is back")
    dialog.locator("button", has_text="Dry run").click()
    expect(dialog.locator("[data-result=dry-run]")).to_contain_text("A replay is allowed")
    expect(replay).to_be_enabled()
    assert command("r-retry", "d-1/email/send/0")["status"] == "STUCK", "a dry run changed nothing"
    replay.click()
    result = dialog.locator("[data-result=applied]")
    expect(result).to_contain_text("STUCK")
    expect(result).to_contain_text("PENDING")
    expect(result).to_contain_text("mail service is back")
    dialog.locator("button", has_text="Close").click()
    expect(card).to_have_attribute("data-status", "CONFIRMED", timeout=TIMEOUT_MS)
    not_reloaded(page)
    assert command("r-retry", "d-1/email/send/0")["replays"] == 1
    page.close()


@test
def approves_a_blocked_wire_and_watches_it_confirm_live(browser):
    page = browser.new_page()
    sign_in(page, "admin")
    page.goto(ARGS.base + "/ui/#/run/r-blocked")
    card = page.locator("details[data-key='d-1/payments/wire/0']")
    expect(card).to_have_attribute("data-status", "BLOCKED")
    expect(page.locator(".live")).to_have_attribute("data-state", "live")
    mark(page)
    # The arguments read as money, not as minor units.
    if card.get_attribute("open") is None:
        card.locator(":scope > summary").click()
    expect(card.locator("[data-money=amount_minor]")).to_have_text("EUR 20,000.00")
    card.locator("[data-action=approve]").click()
    dialog = page.locator("#action")
    # What is approved: the run, the tool, the arguments and why policy holds it.
    expect(dialog.locator("[data-fact=run]")).to_contain_text("r-blocked")
    expect(dialog.locator("[data-fact=tool]")).to_contain_text(WIRE)
    expect(dialog.locator("[data-fact=args] [data-money=amount_minor]")).to_have_text("EUR 20,000.00")
    expect(dialog.locator("[data-fact=args]")).to_contain_text("acc-big")
    reason = dialog.locator("[data-policy-reason]")
    expect(reason).to_have_attribute("data-policy-reason", "found")
    expect(reason).to_contain_text("amount_minor = 2000000 is above the approval threshold 1000000")
    shot(page, "approve-dialog")
    dialog.locator("textarea[name=reason]").fill("invoice 42 checked")
    dialog.locator("button", has_text="Approve").click()
    result = dialog.locator("[data-result=applied]")
    expect(result).to_contain_text("BLOCKED")
    expect(result).to_contain_text("APPROVED")
    expect(result).to_contain_text("invoice 42 checked")
    dialog.locator("button", has_text="Close").click()
    # The card moves to CONFIRMED by the lifecycle events, without a reload.
    expect(card).to_have_attribute("data-status", "CONFIRMED", timeout=TIMEOUT_MS)
    not_reloaded(page)
    if card.get_attribute("open") is None:
        card.locator(":scope > summary").click()
    timeline = card.locator("ol.timeline")
    expect(timeline).to_contain_text("invoice 42 checked")
    expect(timeline).to_contain_text("console-admin")
    shot(page, "run-approved")
    assert command("r-blocked", "d-1/payments/wire/0")["approval"]["approver"] == "console-admin"
    page.close()


@test
def edits_a_blocked_wire_as_it_approves_it(browser):
    # Its own wire, made here: the overview's counts of what seed() left BLOCKED stay as they are.
    submit("agent-a", "r-edit", 1, WIRE, wire("acc-edit", 2_500_000))
    page = browser.new_page()
    sign_in(page, "admin")
    page.goto(ARGS.base + "/ui/#/run/r-edit")
    card = page.locator("details[data-key='d-1/payments/wire/0']")
    expect(card).to_have_attribute("data-status", "BLOCKED")
    card.locator("[data-action=approve]").click()
    dialog = page.locator("#action")
    args = dialog.locator("textarea[name=args]")
    expect(args).to_have_value(re.compile('"amount_minor": 2500000'))
    dialog.locator("textarea[name=reason]").fill("the invoice says 15,000.00")
    # Not JSON: refused in the page, nothing sent.
    args.fill("{not json")
    dialog.locator("button", has_text="Approve").click()
    expect(dialog.locator("[role=alert]")).to_contain_text("not JSON")
    assert command("r-edit", "d-1/payments/wire/0")["status"] == "BLOCKED"
    args.fill(json.dumps(wire("acc-edit", 1_500_000), indent=2))
    dialog.locator("button", has_text="Approve").click()
    result = dialog.locator("[data-result=applied]")
    expect(result).to_contain_text("APPROVED")
    expect(result).to_contain_text("revision 1: /amount_minor")
    shot(page, "approve-edited")
    dialog.locator("button", has_text="Close").click()
    expect(card).to_have_attribute("data-status", "CONFIRMED", timeout=TIMEOUT_MS)
    if card.get_attribute("open") is None:
        card.locator(":scope > summary").click()
    expect(card.locator("[data-revisions]")).to_contain_text("/amount_minor 2500000 → 1500000")
    stored = command("r-edit", "d-1/payments/wire/0")
    assert stored["revisions"][0]["by"] == "console-admin", stored
    assert stored["revisions"][0]["args"]["amount_minor"] == 1_500_000
    page.close()


@test
def rolls_a_run_back_and_watches_it_compensate(browser):
    page = browser.new_page()
    sign_in(page, "admin")
    page.goto(ARGS.base + "/ui/#/run/r-rollback")
    expect(page.locator("details[data-key]")).to_have_count(3)
    expect(page.locator(".live")).to_have_attribute("data-state", "live")
    mark(page)
    page.click("#rollback")
    dialog = page.locator("#action")
    dialog.locator("textarea[name=reason]").fill("customer cancelled")
    dialog.locator("button", has_text="Roll back").click()
    begun = dialog.locator("[data-result=rollback]")
    expect(begun).to_contain_text("Rollback begun")
    expect(begun).to_contain_text("run rollback: customer cancelled")
    dialog.locator("button", has_text="Close").click()
    panel = page.locator("[data-rollback-done]")
    expect(panel).to_be_visible()
    expect(panel).to_have_attribute("data-rollback-done", "true", timeout=TIMEOUT_MS)
    expect(page.locator("details[data-key='d-1/payments/wire/0']")).to_have_attribute(
        "data-status", "COMPENSATED", timeout=TIMEOUT_MS
    )
    expect(page.locator("details[data-key='d-2/tickets/create/0']")).to_have_attribute(
        "data-status", "COMPENSATED"
    )
    expect(page.locator("details[data-key='d-3/email/send/0']")).to_have_attribute(
        "data-status", "NO_COMPENSATION"
    )
    not_reloaded(page)
    expect(panel).to_contain_text("Rollback done")
    expect(page.locator("[aria-label='Run records']")).to_contain_text("customer cancelled")
    shot(page, "run-rolled-back")
    status, progress, _ = call("GET", "/v1/runs/r-rollback/rollback", TOKENS["operator"])
    assert status == 200 and progress["progress"]["done"], progress
    page.close()


@test
def marks_rolled_back_runs_and_shows_dates_on_one_line(browser):
    page = browser.new_page()
    sign_in(page, "operator")
    rolled = page.locator("tr[data-run=r-rollback]")
    expect(rolled).to_have_attribute("data-rolled-back", "true")
    expect(rolled.locator("[data-status=ROLLED_BACK]")).to_contain_text("rolled back")
    expect(page.locator("tr[data-run=r-tamper]")).not_to_have_attribute("data-rolled-back", "true")
    expect(page.locator("tr[data-run=r-tamper] [data-status=ROLLED_BACK]")).to_have_count(0)
    # Dates on one line: a cell's date is no taller than its line, and has no line break.
    created = page.locator("tr[data-run=r-tamper] td:nth-child(3) time")
    line = float(created.evaluate("t => parseFloat(getComputedStyle(t).lineHeight)"))
    box = created.bounding_box()
    assert box["height"] <= line * 1.2, (box, line)
    assert "\n" not in created.inner_text()
    # The queue shows the waiting wire's amount as money.
    page.click("nav >> text=Queues")
    waiting = page.locator("table[aria-label='Blocked effects'] tr[data-run=r-blocked-2]")
    expect(waiting).to_contain_text("amount_minor: EUR 30,000.00")
    page.goto(ARGS.base + "/ui/#/runs")
    expect(rolled).to_be_visible()
    shot(page, "runs-rolled-back")
    page.close()


@test
def verifies_a_chain_and_names_the_first_broken_link(browser):
    page = browser.new_page()
    sign_in(page, "admin")
    page.click("nav >> text=Audit")
    page.fill("#audit-run", "r-rollback")
    page.keyboard.press("Enter")
    verdict = page.locator("[data-verdict]")
    expect(verdict).to_have_attribute("data-verdict", "valid")
    expect(verdict).to_contain_text("The chain verifies")
    shot(page, "audit-valid")
    # Tamper with one record of r-tamper in the ledger file, as an intruder with disk access.
    tamper_seq = tamper("r-tamper")
    page.fill("#audit-run", "r-tamper")
    page.keyboard.press("Enter")
    expect(verdict).to_have_attribute("data-verdict", "broken")
    expect(verdict).to_contain_text(f"broken at record #{tamper_seq}")
    expect(page.locator(f"tr.broken[data-seq='{tamper_seq}']")).to_contain_text("first broken")
    shot(page, "audit-broken")
    page.close()


def tamper(run):
    """Rewrites the reason of `run`'s second audit record in the SQLite ledger; its seq."""
    files = [f for f in glob.glob(os.path.join(ARGS.ledger, "**", "*"), recursive=True)
             if os.path.isfile(f) and not f.endswith(("-wal", "-shm", "-journal"))]
    for path in files:
        try:
            db = sqlite3.connect(path, timeout=10)
            row = db.execute("SELECT run_seq FROM runs WHERE run_id = ?", (run,)).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row is None:
            db.close()
            continue
        seq, record = db.execute(
            "SELECT seq, record FROM audit WHERE run_seq = ? ORDER BY seq LIMIT 1 OFFSET 1", (row[0],)
        ).fetchone()
        altered = json.loads(record)
        altered["reason"] = (altered.get("reason") or "") + " (edited)"
        db.execute("UPDATE audit SET record = ? WHERE run_seq = ? AND seq = ?",
                   (json.dumps(altered), row[0], seq))
        db.commit()
        db.close()
        return seq
    raise AssertionError(f"no ledger file under {ARGS.ledger} holds run {run}")


@test
def shows_scheduled_effects_and_cancels_one(browser):
    page = browser.new_page()
    sign_in(page, "admin")
    page.click("nav >> text=Scheduled")
    row = page.locator("table[aria-label='Scheduled effects'] tr[data-run=r-later]")
    expect(row).to_be_visible()
    expect(row).to_contain_text("email/send")
    shot(page, "scheduled")
    row.locator("[data-action=cancel]").click()
    dialog = page.locator("#action")
    dialog.locator("textarea[name=reason]").fill("not needed any more")
    dialog.locator("button", has_text="Cancel").click()
    expect(dialog.locator("[data-result=applied]")).to_contain_text("CANCELLED")
    dialog.locator("button", has_text="Close").click()
    expect(row).to_have_count(0)
    expect(page.locator(".empty")).to_contain_text("Nothing is scheduled")
    assert command("r-later", "d-1/email/send/0")["status"] == "CANCELLED"
    page.close()


@test
def pauses_a_tool_and_resumes_it_from_the_flow_view(browser):
    page = browser.new_page()
    sign_in(page, "admin")
    page.click("nav >> text=Flow")
    row = page.locator("table[aria-label='Flow control'] tr[data-name='search/lookup']")
    expect(row).to_have_attribute("data-paused", "0")
    row.locator("[data-action=pause]").click()
    dialog = page.locator("#action")
    dialog.locator("textarea[name=reason]").fill("the search provider's maintenance")
    dialog.locator("button", has_text="Pause").click()
    expect(dialog.locator("[data-result=paused]")).to_contain_text("search/lookup: paused")
    dialog.locator("button", has_text="Close").click()
    expect(row).to_have_attribute("data-paused", "1")
    expect(row).to_contain_text("the search provider's maintenance")
    shot(page, "flow-paused")
    status, body, _ = call("GET", "/v1/flow", TOKENS["operator"])
    entry = next(e for e in body["flow"] if e["name"] == "search/lookup")
    assert status == 200 and "admin" in entry["paused"]["actor"], entry
    # An operator sees it and cannot act; the server refuses too.
    other = browser.new_page()
    sign_in(other, "operator")
    other.goto(ARGS.base + "/ui/#/flow")
    button = other.locator("tr[data-name='search/lookup'] [data-action=resume]")
    expect(button).to_be_disabled()
    answer = in_page_fetch(other, "POST", "/v1/flow/search%2Flookup:resume", {"reason": "trying"})
    assert answer["status"] == 403, answer
    other.close()
    row.locator("[data-action=resume]").click()
    dialog.locator("textarea[name=reason]").fill("maintenance over")
    dialog.locator("button", has_text="Resume").click()
    expect(dialog.locator("[data-result=resumed]")).to_contain_text("search/lookup: resumed")
    dialog.locator("button", has_text="Close").click()
    expect(row).to_have_attribute("data-paused", "0")
    status, body, _ = call("GET", "/v1/flow", TOKENS["operator"])
    assert next(e for e in body["flow"] if e["name"] == "search/lookup")["paused"] is None
    page.close()


@test
def an_operator_reads_everything_and_cannot_act(browser):
    page = browser.new_page()
    sign_in(page, "operator")
    expect(page.locator("tr[data-run=r-blocked-2]")).to_be_visible()
    page.goto(ARGS.base + "/ui/#/run/r-blocked-2")
    card = page.locator("details[data-key='d-1/payments/wire/0']")
    expect(card).to_have_attribute("data-status", "BLOCKED")
    approve = card.locator("[data-action=approve]")
    expect(approve).to_be_disabled()
    assert "admin token" in approve.get_attribute("title")
    expect(page.locator("#rollback")).to_be_disabled()
    expect(page.locator("#read-only")).to_contain_text("admin token")
    shot(page, "operator-read-only")
    # The server refuses too: the disabled button is a courtesy, not the rule.
    answer = in_page_fetch(page, "POST", "/v1/runs/r-blocked-2/effects/d-1%2Fpayments%2Fwire%2F0:approve",
                           {"reason": "trying"})
    assert answer["status"] == 403, answer
    answer = in_page_fetch(page, "POST", "/v1/runs/r-blocked-2/rollback", {"reason": "trying"})
    assert answer["status"] == 403, answer
    assert command("r-blocked-2", "d-1/payments/wire/0")["status"] == "BLOCKED"
    page.close()


@test
def an_agent_sees_only_its_own_runs(browser):
    page = browser.new_page()
    sign_in(page, "agent-b")
    expect(page.locator("main h1")).to_contain_text("Your runs")
    expect(page.locator("tr[data-run=r-b-private]")).to_be_visible()
    expect(page.locator("tr[data-run]")).to_have_count(1)
    shot(page, "agent-runs")
    page.click("tr[data-run=r-b-private] a")
    expect(page.locator("details[data-key='d-1/email/send/0']")).to_be_visible()
    expect(page.locator(".live")).to_have_attribute("data-state", "live")
    page.goto(ARGS.base + "/ui/#/run/r-rollback")
    alert = page.locator("main [role=alert]")
    expect(alert).to_contain_text("may not see")
    expect(page.locator("details[data-key]")).to_have_count(0)
    shot(page, "agent-forbidden")
    # The overview counts every run: no link for an agent, and the server refuses it.
    expect(page.locator("nav [data-view=overview]")).to_be_hidden()
    expect(page.locator("nav [data-view=budgets]")).to_be_hidden()
    page.goto(ARGS.base + "/ui/#/overview")
    expect(page.locator("main [role=alert]")).to_contain_text("may not see")
    for path in ("/v1/runs/r-rollback/audit", "/v1/events/stream?run_id=r-rollback", "/v1/runs", "/v1/overview"):
        answer = in_page_fetch(page, "GET", path)
        assert answer["status"] == 403, (path, answer)
    # Agent B's queues and schedule hold its own effects only: agent A's are not there.
    page.goto(ARGS.base + "/ui/#/queues")
    expect(page.locator("main")).to_contain_text("Your own runs' effects only")
    expect(page.locator("main")).to_contain_text("Nothing waits for approval")
    expect(page.locator("tr[data-run]")).to_have_count(0)
    page.goto(ARGS.base + "/ui/#/scheduled")
    expect(page.locator("main .empty")).to_contain_text("Nothing is scheduled")
    page.close()


@test
def works_from_the_keyboard(browser):
    page = browser.new_page()
    sign_in(page, "admin")
    page.goto(ARGS.base + "/ui/#/runs")
    # A reload signs in again from the tab's session storage, with focus at the top.
    page.reload()
    expect(page.locator("tr[data-run]").first).to_be_visible()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    # Tab to the Queues link and follow it with Enter.
    for _ in range(10):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Queues":
            break
    assert page.evaluate("document.activeElement.textContent") == "Queues"
    page.keyboard.press("Enter")
    expect(page.locator("main h1")).to_contain_text("Queues")
    expect(page.locator("nav a[aria-current=page]")).to_have_text("Queues")
    # Focus lands on the new view's heading, not on the link just followed.
    expect(page.locator("main h1")).to_be_focused()
    # A dialog opens with focus in it and closes with Escape.
    page.goto(ARGS.base + "/ui/#/run/r-blocked-2")
    page.locator("[data-action=approve]").focus()
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.name") == "reason"
    page.keyboard.press("Escape")
    expect(page.locator("#action")).not_to_be_visible()
    page.close()


# --- Approval links ----------------------------------------------------------------------


def approval_link(run, key, **body):
    status, answer, _ = call("POST", key_path(run, key) + ":approval-link", TOKENS["admin"], body)
    assert status == 201, f"approval link for {run}/{key}: {status} {answer}"
    assert answer["url"].startswith(ARGS.base + "/approve/v1."), answer
    return answer


def blocked_wire(run, account, amount=2_500_000):
    answer = submit("agent-a", run, 1, WIRE, wire(account, amount))
    assert answer["status"] == "BLOCKED", answer
    return answer["command_key"]


def signed_token(claims):
    """A link token made here with `sluice dev`'s key from its data directory, the format of
    sluice_core::approval_link: v1.<claims>.<HMAC-SHA256 over the domain and the claims>."""
    with open(os.path.join(ARGS.ledger, "approval-link.key"), encoding="utf-8") as f:
        key = f.read().strip().encode()
    b64 = lambda raw: base64.urlsafe_b64encode(raw).rstrip(b"=").decode()  # noqa: E731
    body = b64(json.dumps(claims, separators=(",", ":")).encode())
    mac = hmac.new(key, b"sluice-approval-link-v1\n" + body.encode(), hashlib.sha256).digest()
    return f"v1.{body}.{b64(mac)}"


@test
def approves_a_blocked_wire_through_an_approval_link_once(browser):
    key = blocked_wire("r-link", "acc-link")
    link = approval_link("r-link", key, expires_in_s=600, **{"for": "alice@example.com"})
    page = browser.new_page()  # no sign-in: the link is the credential
    response = page.goto(link["url"])
    assert response.status == 200, response.status
    expect(page.locator("#command")).to_be_visible()
    expect(page.locator("#tool")).to_have_text(WIRE)
    expect(page.locator("#run")).to_have_text("r-link")
    expect(page.locator("#submitter")).to_have_text("agent-a")
    expect(page.locator("#args")).to_contain_text("acc-link")
    expect(page.locator("#args")).to_contain_text("2500000")
    expect(page.locator("#why")).to_contain_text("approval threshold")
    expect(page.locator("#link")).to_contain_text("for alice@example.com")
    shot(page, "approval-link")
    # The page holds no inline script and runs under the console's policy.
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp, csp
    page.fill("#reason", "beneficiary checked by phone")
    page.click("#approve")
    expect(page.locator("#done")).to_contain_text("Approved")
    shot(page, "approval-link-approved")
    found = wait_for("r-link", key, {"CONFIRMED"})
    assert found["approval"]["approver"] == f"link:{link['link_id']} (for alice@example.com, issued by console-admin)", found["approval"]
    assert found["approval"]["reason"] == "beneficiary checked by phone", found["approval"]
    status, trail, _ = call("GET", "/v1/runs/r-link/audit", TOKENS["admin"])
    assert status == 200, trail
    actors = [e["actor"] for e in trail["entries"] if e.get("to") == "APPROVED"]
    assert actors == [found["approval"]["approver"]], trail
    token = link["url"].rsplit("/", 1)[1]
    assert token not in json.dumps(trail), "the token reached the audit chain"
    # Used: reopened, it answers 410 and says so; nothing changes.
    again = page.goto(link["url"])
    assert again.status == 410, again.status
    expect(page.locator("#gone")).to_contain_text("already used")
    shot(page, "approval-link-used")
    assert command("r-link", key)["status"] == "CONFIRMED"
    page.close()


@test
def an_expired_or_edited_link_answers_410_and_changes_nothing(browser):
    key = blocked_wire("r-link-expired", "acc-expired")
    found = command("r-link-expired", key)
    now = int(time.time() * 1000)
    claims = {
        "id": "expired-link-1", "run_id": "r-link-expired", "command_key": key,
        "args_hash": found["args_hash"], "policy_version": found["policy_version"],
        "issued_at": now - 120_000, "expires_at": now - 60_000, "issuer": "console-admin",
    }
    page = browser.new_page()
    response = page.goto(f"{ARGS.base}/approve/{signed_token(claims)}")
    assert response.status == 410, response.status
    expect(page.locator("#gone")).to_contain_text("expired")
    shot(page, "approval-link-expired")
    # Signed with the right key but for other arguments: "edited".
    edited = {**claims, "id": "edited-link-1", "expires_at": now + 600_000, "args_hash": "0" * 64}
    response = page.goto(f"{ARGS.base}/approve/{signed_token(edited)}")
    assert response.status == 410, response.status
    expect(page.locator("#gone")).to_contain_text("arguments changed")
    # The same claims, unaltered and unexpired, do open: only the differences were refused.
    good = {**claims, "id": "good-link-1", "expires_at": now + 600_000}
    response = page.goto(f"{ARGS.base}/approve/{signed_token(good)}")
    assert response.status == 200, response.status
    expect(page.locator("#command")).to_be_visible()
    assert command("r-link-expired", key)["status"] == "BLOCKED"
    page.close()


@test
def a_rejection_through_a_link_reaches_the_agent_with_its_reason(browser):
    key = blocked_wire("r-link-reject", "acc-reject")
    # The link made from the console, as an admin would.
    console = browser.new_page()
    sign_in(console, "admin")
    console.goto(ARGS.base + "/ui/#/run/r-link-reject")
    card = console.locator(f"details[data-key='{key}']")
    expect(card).to_have_attribute("data-status", "BLOCKED")
    if card.get_attribute("open") is None:
        card.locator(":scope > summary").click()
    card.locator("[data-action=link]").click()
    dialog = console.locator("#action")
    dialog.locator("input[name=for]").fill("bob@example.com")
    dialog.locator("button", has_text="Create link").click()
    url_field = dialog.locator("#link-url")
    expect(url_field).to_be_visible()
    url = url_field.input_value()
    assert url.startswith(ARGS.base + "/approve/v1."), url
    shot(console, "approval-link-created")
    link = {"url": url, "link_id": dialog.locator("[data-result=link] label").inner_text().split()[1].rstrip(",")}
    console.close()
    page = browser.new_page()  # another tab: no token in its session storage
    page.goto(link["url"])
    expect(page.locator("#command")).to_be_visible()
    # No reason: refused on the page, nothing sent.
    page.click("#reject")
    expect(page.locator("#done")).to_contain_text("reason is required")
    page.fill("#reason", "wrong beneficiary")
    page.click("#reject")
    expect(page.locator("#done")).to_contain_text("Rejected")
    # The agent's own read: CANCELLED, with who and why.
    status, seen, _ = call("GET", key_path("r-link-reject", key), TOKENS["agent-a"])
    assert status == 200, seen
    assert seen["status"] == "CANCELLED", seen
    assert seen["rejection"]["reason"] == "wrong beneficiary", seen
    assert seen["rejection"]["by"].startswith(f"link:{link['link_id']}"), seen
    page.close()


@test
def shows_budgets_and_what_they_hold(browser):
    status, answer, _ = call("GET", "/v1/budgets", TOKENS["operator"])
    assert status == 200, answer
    budget = next(b for b in answer["budgets"] if b["name"] == "console_wires")
    counter = next(c for c in budget["counters"] if c["scope_value"] == "agent-a")
    assert counter["used"] > 0, counter
    page = browser.new_page()
    sign_in(page, "operator")
    page.goto(ARGS.base + "/ui/#/budgets")
    card = page.locator("section[data-budget=console_wires]")
    expect(card).to_be_visible()
    expect(card).to_contain_text("per tenant")
    row = card.locator("tr[data-scope-value=agent-a][data-currency=EUR]")
    expect(row).to_be_visible()
    held = int(row.get_attribute("data-held"))
    assert held >= counter["used"], (held, counter)
    expect(row.locator("td").nth(1)).to_have_text(f"{held:,}")
    shot(page, "budgets")
    page.close()


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--chromium", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--shots", required=True)
    parser.add_argument("-k", default="", help="run only tests whose name holds this")
    ARGS = parser.parse_args()
    os.makedirs(ARGS.shots, exist_ok=True)
    passed = failed = skipped = 0
    try:
        seed()
    except Exception:  # noqa: BLE001 - every failure is reported, the suite goes on to its line
        traceback.print_exc()
        print("console: could not set up the scenarios", file=sys.stderr)
        print(f"0 passed, 1 failed, {len(TESTS)} skipped")
        return 1
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=ARGS.chromium, args=["--no-sandbox"])
        for fn in TESTS:
            name = fn.__name__
            if ARGS.k and ARGS.k not in name:
                skipped += 1
                print(f"skip {name}")
                continue
            context = browser.new_context(viewport={"width": 1366, "height": 850})
            context.set_default_timeout(TIMEOUT_MS)
            started = time.time()
            try:
                fn(context)
                passed += 1
                print(f"ok   {name} ({time.time() - started:.1f}s)")
            except Exception:  # noqa: BLE001
                failed += 1
                print(f"FAIL {name}")
                traceback.print_exc()
                try:
                    for page in context.pages:
                        shot(page, f"failed-{name}")
                except Exception:  # noqa: BLE001
                    pass
            finally:
                context.close()
        browser.close()
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
