"""The dashboard (``/ui``) and the offline API docs (``/docs``) in a real browser: headless Chromium from Debian's
``chromium`` package (scripts/test-packages.sh installs it), driven by Playwright, against a real ``tessera up``.

One server for the module, on one simulated A100 that three workloads share (team-a's training job, team-b's job and
a served model's replica), with a whole-GPU job pending behind them. Every page a test opens records the URLs the
browser asked for, and each test checks that all of them were on 127.0.0.1 (nothing is fetched from elsewhere).
Screenshots go to ``.tessera/test-screenshots/`` in the repository (git-ignored; ``$TESSERA_SCREENSHOTS`` picks
another folder), each named after what it shows and replaced by the next run; the tests check that each was written,
and the session ends with a line that says where they are (tests/conftest.py).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from live_server import ADMIN, LiveServer, free_port, wait_for
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from tessera.client.http import TesseraClient

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("TESSERA_CHROMIUM", "/usr/bin/chromium")
TICKER = "import time\nfor i in range(100000):\n    print('tick', i, flush=True)\n    time.sleep(0.3)"
SLEEP = "import time; time.sleep(3600)"
MARKUP = "<img src=x onerror=window.pwned=1>late"  # a workload name that would run script if shown as HTML
SCREENSHOTS = Path(os.environ.get("TESSERA_SCREENSHOTS") or Path(__file__).parents[2] / ".tessera" / "test-screenshots")
SCREENSHOT_PROPERTY = "screenshot"  # conftest.SCREENSHOT_PROPERTY: the path of each one, on the test's report


@dataclass
class Cluster:
    server: LiveServer
    tokens: dict[str, str]  # tenant -> token
    ids: dict[str, int]  # what the module submitted, by role


@dataclass
class Browsing:
    """A page with the URLs it requested; ``shot`` saves a screenshot into ``SCREENSHOTS``, records its path on the
    test's report (``record``) and returns it."""

    page: Page
    record: Callable[[Path], None]
    requested: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # uncaught errors of the page's scripts

    def shot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.record(path)
        return path


def recorder(request: pytest.FixtureRequest) -> Callable[[Path], None]:
    return lambda path: request.node.user_properties.append((SCREENSHOT_PROPERTY, str(path.resolve())))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian package chromium; scripts/test-packages.sh installs it)")
    with sync_playwright() as playwright:
        yield launch(playwright)


def launch(playwright: Playwright) -> Browser:
    # --no-sandbox: Chromium's sandbox refuses to run as root, which the test machines are.
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    server = LiveServer(tmp_path_factory.mktemp("dashboard") / "server", gpus="1xA100-80GB")
    server.start()
    try:
        yield populate(server)
    finally:
        try:
            with server.client() as client:
                for m in client.models():
                    client.delete_model(m["name"])
            server.cancel_all()
        finally:
            server.stop()


def populate(server: LiveServer) -> Cluster:
    """team-a's ticker (half the GPU) and team-b's sleeper (a quarter) share the GPU with a model's replica (a
    quarter); team-a's whole-GPU job waits."""
    with server.client() as admin:
        tokens = {t: admin.create_token(t)["token"] for t in ("team-a", "team-b")}
        for tenant, gpus in (("team-a", 0.25), ("team-b", 0.5)):  # team-a's ticker borrows from team-b's quota
            admin.put_queue({"name": tenant, "tenant": tenant, "cohort": "lab", "nominal": {"*": {"gpus": gpus}}})
        admin.deploy_model({"name": "chat", "engine": "sim", "model": "llama3-8b", "gpu_fraction": 0.25})
        wait_for(lambda: admin.model("chat")["state"] == "ready", timeout_s=60)
    ids: dict[str, int] = {}
    with server.client(tokens["team-a"]) as a, server.client(tokens["team-b"]) as b:
        ids["ticker"] = a.submit(job("ticker", TICKER, gpu_fraction=0.5))["id"]
        ids["sleeper"] = b.submit(job("sleeper-b", SLEEP, gpu_fraction=0.25))["id"]
        wait_for(lambda: a.workload(ids["ticker"])["state"] == b.workload(ids["sleeper"])["state"] == "running")
        ids["whole"] = a.submit(job("whole-gpu", SLEEP))["id"]
        wait_for(lambda: a.workload(ids["whole"])["reason"], timeout_s=20)
    return Cluster(server, tokens, ids)


def job(name: str, program: str, **share: float) -> dict[str, object]:
    return {"name": name, "command": [sys.executable, "-c", program], "gpus": 1, **share}


@pytest.fixture
def browsing(browser: Browser, cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Browsing]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    seen = Browsing(page, recorder(request))
    page.on("request", lambda request: seen.requested.append(request.url))
    page.on("pageerror", lambda error: seen.errors.append(str(error)))
    yield seen
    context.close()
    outside = [u for u in seen.requested if urlsplit(u).hostname != "127.0.0.1" and not u.startswith("data:")]
    assert not outside, f"requests beyond the server: {outside}"
    assert not seen.errors, f"errors in the page: {seen.errors}"


def sign_in(seen: Browsing, cluster: Cluster, token: str = ADMIN, hash_: str = "#/cluster") -> Page:
    page = seen.page
    page.goto(f"{cluster.server.url}/ui/{hash_}")
    page.fill("#token", token)
    page.click("#signin button[type=submit]")
    expect(page.locator("#signout")).to_be_visible()
    expect(page.locator("#live")).to_have_text("live", timeout=10_000)
    return page


def written(path: Path) -> None:
    assert path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path


# --------------------------------------------------------------------------------------------------------- tests


def test_the_cluster_view_shows_each_gpu_with_the_workloads_sharing_it(browsing: Browsing, cluster: Cluster) -> None:
    page = sign_in(browsing, cluster)
    with cluster.server.client() as admin:
        node = admin.nodes()[0]
    sharing = node["gpus"][0]["workloads"]
    gpu = page.locator(f'[data-gpu="{node["name"]}/0"]')
    assert {cluster.ids["ticker"], cluster.ids["sleeper"]} < set(sharing)  # and the model's replica
    for workload_id in sharing:
        expect(gpu.locator(f'a.seg[data-workload="{workload_id}"]')).to_be_visible()
        expect(gpu.locator(f'a.chip[data-workload="{workload_id}"]')).to_be_visible()
    expect(gpu).to_have_attribute("data-allocated", "1000")
    expect(gpu.locator(".badge.simulated")).to_have_text("simulated")
    expect(page.locator("#view h2")).to_contain_text("simulated GPUs")
    written(browsing.shot("cluster"))


def test_the_workload_list_filters_by_state_and_a_pending_workload_says_why(
    browsing: Browsing, cluster: Cluster
) -> None:
    page = sign_in(browsing, cluster, hash_="#/workloads")
    expect(page.locator(f'tr[data-workload="{cluster.ids["whole"]}"]')).to_be_visible()
    page.select_option("#filter-state", "pending")
    expect(page).to_have_url(f"{cluster.server.url}/ui/#/workloads?state=pending")
    rows = page.locator("#workloads tbody tr[data-workload]")
    others = page.locator("#workloads tbody tr[data-workload]:not([data-state=pending])")
    expect(others).to_have_count(0)  # the filtered list has replaced the whole one
    expect(rows.first).to_be_visible()
    with cluster.server.client() as admin:
        assert rows.count() == len(admin.workloads(["pending"]))
    written(browsing.shot("workloads-pending"))
    page.select_option("#filter-state", "")
    page.select_option("#filter-queue", "team-b")
    expect(page).to_have_url(f"{cluster.server.url}/ui/#/workloads?queue=team-b")
    queues = page.locator("#workloads tbody tr[data-workload] td:nth-child(5)")
    wait_for(lambda: set(queues.all_inner_texts()) == {"team-b"}, timeout_s=5)
    expect(page.locator(f'tr[data-workload="{cluster.ids["sleeper"]}"]')).to_be_visible()
    page.select_option("#filter-queue", "")
    page.select_option("#filter-state", "pending")
    with cluster.server.client() as admin:
        reason = admin.workload(cluster.ids["whole"])["reason"]
    assert reason
    page.click(f'tr[data-workload="{cluster.ids["whole"]}"]')
    expect(page.locator("#why")).to_contain_text(reason)
    expect(page.locator("#events")).to_contain_text("submitted")
    written(browsing.shot("workload-pending-detail"))


def test_a_running_workload_shows_its_placement_and_its_log_live(browsing: Browsing, cluster: Cluster) -> None:
    page = sign_in(browsing, cluster, hash_=f"#/workloads/{cluster.ids['ticker']}")
    with cluster.server.client() as admin:
        node = admin.nodes()[0]["name"]
    expect(page.locator("#placement")).to_contain_text(node)
    expect(page.locator("#request")).to_contain_text("1 × 0.5 GPU")
    log = page.locator("#log")
    expect(log).to_contain_text("tick 1", timeout=10_000)
    last = int(log.inner_text().split()[-1])
    expect(log).to_contain_text(f"tick {last + 3}", timeout=10_000)  # lines keep arriving, no reload
    assert log.inner_text().count("tick 1\n") == 1  # appended by offset: nothing read twice
    written(browsing.shot("workload-log"))


def test_a_workload_submitted_while_the_page_is_open_appears_without_a_reload(
    browsing: Browsing, cluster: Cluster
) -> None:
    page = sign_in(browsing, cluster, hash_="#/workloads")
    page.evaluate("window.unreloaded = true")
    before = int(page.locator("#live").get_attribute("data-last-event-id") or 0)
    with cluster.server.client(cluster.tokens["team-b"]) as b:
        new = b.submit({"name": MARKUP, "command": ["true"]})["id"]
    row = page.locator(f'tr[data-workload="{new}"]')
    expect(row).to_be_visible(timeout=5_000)
    expect(row.locator("td").nth(1)).to_have_text(MARKUP)  # shown as text, never run as markup
    assert page.evaluate("window.unreloaded") is True and page.evaluate("window.pwned") is None
    assert int(page.locator("#live").get_attribute("data-last-event-id") or 0) > before
    assert not any(u.endswith("/ui/") for u in browsing.requested[1:])  # the page itself was loaded once
    written(browsing.shot("live-update"))


def test_a_tenant_sees_only_its_own_workloads(browsing: Browsing, cluster: Cluster) -> None:
    page = sign_in(browsing, cluster, cluster.tokens["team-b"], hash_="#/workloads")
    expect(page.locator("#who")).to_have_text("tenant team-b")
    expect(page.locator(f'tr[data-workload="{cluster.ids["sleeper"]}"]')).to_be_visible()
    tenants = page.locator("#workloads tbody tr[data-workload] td:nth-child(4)").all_inner_texts()
    assert tenants and set(tenants) == {"team-b"}
    page.goto(f"{cluster.server.url}/ui/#/cluster")  # a new load: the token is kept in the tab's session storage
    page.reload()
    gpu = page.locator("[data-gpu]").first
    expect(gpu.locator(f'a.seg[data-workload="{cluster.ids["sleeper"]}"]')).to_be_visible()
    expect(gpu.locator(".seg.others")).to_be_visible()  # the rest of the GPU, with no one else's ids
    shown = {int(x) for x in gpu.locator("[data-workload]").evaluate_all("els => els.map(e => e.dataset.workload)")}
    assert shown == {cluster.ids["sleeper"]}
    written(browsing.shot("tenant-cluster"))
    page.click("#signout")
    expect(page.locator("#signin")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('tessera.token')") is None


def test_a_wrong_token_is_refused_at_sign_in(browsing: Browsing, cluster: Cluster) -> None:
    page = browsing.page
    page.goto(f"{cluster.server.url}/ui/")
    page.fill("#token", "not-a-token")
    page.click("#signin button[type=submit]")
    expect(page.locator("#signin-error")).to_have_text("That token was refused.")
    expect(page.locator("#nav")).to_be_hidden()


def test_a_failing_model_shows_its_state_and_last_error(browsing: Browsing, cluster: Cluster) -> None:
    """A model whose engine cannot start is ``failing`` with the engine's last line (issue 25, defect 6); on the
    CPU (no GPU share), and deleted afterwards, so the other views see the cluster as it was."""
    with cluster.server.client() as admin:
        admin.deploy_model({"name": "broken", "engine": "vllm", "model": "/nonexistent", "gpus": 0})
        try:
            failing = wait_for(lambda: (m := admin.model("broken"))["state"] == "failing" and m, timeout_s=60)
            page = sign_in(browsing, cluster, hash_="#/models")
            row = page.locator('tr[data-model="broken"]')
            expect(row.locator(".badge")).to_have_text("failing")
            expect(row.locator(".error")).to_have_text(failing["last_error"])
            written(browsing.shot("model-failing"))
        finally:
            admin.delete_model("broken")
            wait_for(lambda: all(m["name"] != "broken" for m in admin.models()), timeout_s=60)


def test_the_models_and_queues_views(browsing: Browsing, cluster: Cluster) -> None:
    with cluster.server.client() as admin:  # the server's history of the queues' usage, from before the page opens
        served = {q["queue"]: q["points"] for q in admin.queue_usage()["queues"]}
    assert any(p["gpu_milli"] == 500 and p["borrowed_milli"] == 250 for p in served["team-a"]), served
    opened = time.time()
    page = sign_in(browsing, cluster, hash_="#/models")
    row = page.locator('tr[data-model="chat"]')
    expect(row).to_contain_text("ready")
    expect(row).to_contain_text("1 ready")
    expect(row.locator("code.url")).to_have_text(f"{cluster.server.url}/openai/v1")
    written(browsing.shot("models"))
    page.click('nav a[data-view="queues"]')
    team_a, team_b = page.locator('tr[data-queue="team-a"]'), page.locator('tr[data-queue="team-b"]')
    expect(team_a).to_contain_text("*: 0.25 GPU")  # its nominal quota
    expect(team_a).to_contain_text("0.5 GPU")  # in use: over its quota, borrowed in its cohort
    expect(team_a.locator(".badge.borrowing")).to_be_visible()
    expect(team_b).to_contain_text("0.25 GPU")
    expect(team_b.locator(".badge.borrowing")).to_have_count(0)
    # Usage over time: drawn from the server's samples, which go back to before the page opened, then appended live.
    spark = team_a.locator("svg.spark")
    expect(spark).to_have_attribute("data-server-points", re.compile(r"^[1-9][0-9]*$"))
    assert float(spark.get_attribute("data-first-at") or "inf") < opened
    assert spark.locator("polyline.used").get_attribute("points") and spark.locator("polyline.nominal").count() == 1
    drawn = int(spark.get_attribute("data-points") or 0)
    with cluster.server.client(cluster.tokens["team-b"]) as b:
        b.submit({"name": "nudge", "command": ["true"]})  # an event: the view is fetched again, a point appended
    wait_for(lambda: int(spark.get_attribute("data-points") or 0) > drawn, timeout_s=10)
    written(browsing.shot("queues"))


def test_the_models_view_shows_each_models_requests_against_its_slo_and_its_replicas_over_time(
    browsing: Browsing, cluster: Cluster
) -> None:
    """Requests sent through the gateway (/openai) to the sim model show in the models view: a rate above zero, the
    TTFT and TPOT percentiles next to the SLO class's targets, the replica count and its line over time, the setup."""
    with cluster.server.client() as admin:
        before = admin.model_stats("chat")
    ai = openai.OpenAI(base_url=f"{cluster.server.url}/openai/v1", api_key=ADMIN, max_retries=0, timeout=60)
    messages: Any = [{"role": "user", "content": "how are the replicas doing?"}]
    for _ in range(3):
        stream = ai.chat.completions.create(model="chat", messages=messages, max_tokens=8, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert ai.chat.completions.create(model="chat", messages=messages, max_tokens=8).choices[0].message.content
    with cluster.server.client() as admin:
        stats = admin.model_stats("chat")
    assert stats["window"]["requests"] - (before["window"] or {"requests": 0})["requests"] == 6
    assert stats["window"]["tpot_p50_s"] is not None and stats["targets"] == {"ttft_s": 10.0, "tpot_s": 0.5}
    env = {**os.environ, "TESSERA_URL": cluster.server.url, "TESSERA_TOKEN": ADMIN}
    printed = subprocess.run(
        [sys.executable, "-m", "tessera.cli", "models", "stats", "chat"], capture_output=True, text=True, env=env,
        timeout=60,
    )  # fmt: skip
    assert printed.returncode == 0 and "req/s" in printed.stdout and "1 ready" in printed.stdout, printed
    page = sign_in(browsing, cluster, hash_="#/models")
    row = page.locator('tr[data-model-stats="chat"]')
    expect(row).to_have_attribute("data-ready", "1")
    assert float(row.get_attribute("data-rate") or 0) > 0
    assert int(row.get_attribute("data-requests") or 0) >= 6
    expect(row.locator("td.rate")).to_contain_text("req/s")
    expect(row.locator("td.ttft")).to_contain_text("target 10 s")
    expect(row.locator("td.tpot")).to_contain_text("target 500 ms")
    expect(row.locator("td.replicas")).to_contain_text("1 ready / 1 desired")
    expect(row.locator("td.setup")).to_contain_text("setup tessera, router prefix-affinity, autoscaler tessera")
    spark = row.locator("svg.spark")
    assert int(spark.get_attribute("data-points") or 0) >= 1
    assert spark.locator("polyline.used").get_attribute("points")
    written(browsing.shot("models-serving"))


def test_the_api_docs_load_offline_and_authorize_sends_the_token(browsing: Browsing, cluster: Cluster) -> None:
    page = browsing.page
    page.goto(f"{cluster.server.url}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Tessera")
    page.click("button.authorize")
    page.fill(".modal-ux input", ADMIN)
    page.click(".modal-ux button.authorize")
    page.click(".modal-ux button.btn-done")
    operation = page.locator("#operations-queues-queues_v1_queues_get")
    operation.locator(".opblock-summary").click()
    operation.locator("button.try-out__btn").click()
    operation.locator("button.execute").click()
    expect(operation.locator(".live-responses-table tr.response td.response-col_status")).to_have_text("200")
    written(browsing.shot("docs"))
    assert any(u.endswith("/docs/assets/swagger-ui-bundle.js") for u in browsing.requested)


def test_an_open_event_stream_does_not_hold_up_a_shutdown(tmp_path: Path) -> None:
    """uvicorn waits for open responses when it stops: the stream must end when the shutdown begins."""
    server = LiveServer(tmp_path / "server")
    server.start()
    lines: list[str] = []

    def listen() -> None:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        try:
            with httpx.stream("GET", f"{server.url}/v1/events/stream", headers=headers, timeout=30) as response:
                lines.extend(response.iter_lines())
        except httpx.HTTPError as error:
            lines.append(repr(error))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    wait_for(lambda: any(line.startswith("data:") for line in lines))
    started = time.monotonic()
    server.stop()
    assert server.process is not None and server.process.returncode == 0
    assert time.monotonic() - started < 4.0  # the stream's default lifetime is 300 s
    listener.join(timeout=5)
    assert lines[-1] == "", lines  # the stream ended cleanly, not cut off


def test_the_demo_as_its_tenant_sees_it(browser: Browser, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """``make run`` (``tessera up --demo``): the printed dashboard URL, signed in with the printed tenant token, shows
    the demo's workloads and the GPUs they run on."""
    port, out = free_port(), tmp_path / "out.log"
    command = [sys.executable, "-m", "tessera.cli", "up", "--demo", "--port", str(port), "--data-dir", str(tmp_path)]
    with out.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        printed = wait_for(lambda: "Stop with Ctrl-C" in out.read_text() and out.read_text(), timeout_s=60)
        url = re.search(r"dashboard: (http://127\.0\.0\.1:\d+/ui)", printed)
        token = re.search(r"TESSERA_TOKEN=(\S+)", printed)
        assert url and token, printed
        with TesseraClient(url.group(1).removesuffix("/ui"), token.group(1)) as demo:
            running = wait_for(lambda: demo.workloads(["running"]), timeout_s=30)
        seen = Browsing(context.new_page(), recorder(request))
        seen.page.on("request", lambda request: seen.requested.append(request.url))
        seen.page.on("pageerror", lambda error: seen.errors.append(str(error)))
        page = seen.page
        page.goto(url.group(1))
        page.fill("#token", token.group(1))
        page.click("#signin button[type=submit]")
        on_gpus = [w for w in running if w["gpus"]]
        assert on_gpus, running
        for w in on_gpus:
            expect(page.locator(f'.gpu a.seg[data-workload="{w["id"]}"]').first).to_be_visible()
        written(seen.shot("demo-cluster"))
        page.click('nav a[data-view="workloads"]')
        for w in running:
            expect(page.locator(f'tr[data-workload="{w["id"]}"]')).to_be_visible()
        written(seen.shot("demo-workloads"))
        assert all(urlsplit(u).hostname == "127.0.0.1" for u in seen.requested if not u.startswith("data:"))
        assert not seen.errors, f"errors in the page: {seen.errors}"
    finally:
        context.close()
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
