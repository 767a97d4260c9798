"""End to end against the real Postern desktop app under Xvfb (run by src-tauri/tests/it).

WebDriver: tauri-driver in front of WebKitWebDriver (Debian's webkit2gtk-driver), driven with
Selenium. The agent is the official Python MCP SDK (tests/clients/python/agent.py) speaking
through `postern mcp`; the target is a local HTTP server that counts the POSTs it executes.

Scenario 1, per-use approval: the agent calls a tool whose credential needs approval for every
use → the approval window appears; the test checks what it shows and approves → the target
counts 1 → the call is in Activity with its timeline.
The Servers view adds a remote server, offers OAuth because it asks for it, and signs it in
(tests/upstreams/oauth_provider.py).
Scenario 2, retry review: an irreversible call is authorized (session question) and dispatched,
the connection is cut after the target executed, the agent retries → the review window shows
the original record → "return the recorded result" → the target still counts one wire.

Environment: POSTERN_APP, POSTERN_BIN (binaries), SCREENSHOTS (a directory, optional),
BENCH_ROWS (optional: then the Activity view is timed on a journal of that many executions).
Prints one JSON line of figures at the end; exits non-zero on the first failed check.
"""

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.common.exceptions import NoSuchWindowException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.options import ArgOptions

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
APP = os.environ["POSTERN_APP"]
POSTERN = os.environ["POSTERN_BIN"]
SHOTS = os.environ.get("SCREENSHOTS")
SECRET = "CANARY-desktop-91f3-bank-token"
UPSTREAM_SECRET = "CANARY-desktop-upstream-77c2"
TEMPORARY = []  # data directories to remove at the end (the 1M-row journal is ~400 MB)


def step(what):
    print(f"[e2e {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def wait_for(what, f, limit=30.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        value = f()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Target(http.server.BaseHTTPRequestHandler):
    posts = 0
    vanished = 0
    hold = threading.Event()
    lock = threading.Lock()

    def do_POST(self):
        length = int(self.headers.get("content-length", 0))
        self.rfile.read(length)
        if self.path == "/vanish":
            # Takes the request and hangs up without an answer: the outcome is unknown.
            with Target.lock:
                Target.vanished += 1
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        with Target.lock:
            Target.posts += 1
            n = Target.posts
        while Target.hold.is_set():
            time.sleep(0.05)
        body = json.dumps({"id": f"pay_{n}"}).encode()
        self.send_response(201)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Notifications:
    """The desktop's notification daemon (dunst, under the test's Xvfb and D-Bus session) and a
    `dbus-monitor` recording every Notify call it receives, so a test can check that a
    notification was raised and act on it as a person would."""

    def __init__(self):
        self.log = tempfile.NamedTemporaryFile(prefix="postern-notify-", suffix=".log", delete=False)
        TEMPORARY.append(self.log.name)
        self.monitor = subprocess.Popen(
            ["dbus-monitor", "--session", "interface='org.freedesktop.Notifications',member='Notify'"],
            stdout=self.log, stderr=subprocess.DEVNULL)
        self.daemon = subprocess.Popen(["dunst"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for("the notification daemon", lambda: subprocess.run(
            ["dunstctl", "is-paused"], capture_output=True).returncode == 0, 15)

    def raised(self, summary):
        with open(self.log.name) as f:
            return f'string "{summary}"' in f.read()

    def wait(self, summary, limit=15.0):
        wait_for(f"the notification {summary!r}", lambda: self.raised(summary), limit)

    def activate_newest(self):
        """Clicks the newest notification on screen (its default action), as a person would."""
        subprocess.run(["dunstctl", "action", "0"], check=True, timeout=5)

    def stop(self):
        for p in (self.daemon, self.monitor):
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def focused_window_name():
    out = subprocess.run(["xdotool", "getwindowfocus", "getwindowname"], capture_output=True, text=True, timeout=5)
    return out.stdout.strip()


def window_names():
    """The names of the app's visible X windows."""
    ids = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", "Postern"],
                         capture_output=True, text=True, timeout=5).stdout.split()
    return [subprocess.run(["xdotool", "getwindowname", i], capture_output=True, text=True, timeout=5).stdout.strip()
            for i in ids]


def focus_window_named(name):
    """Gives the X input focus to the app window titled exactly `name` (there is no window
    manager under Xvfb, so xdotool sets it directly)."""
    ids = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", f"^{name}$"],
                         capture_output=True, text=True, timeout=5).stdout.split()
    check(ids, f"a window named {name!r}")
    subprocess.run(["xdotool", "windowfocus", ids[-1]], check=True, timeout=5)


def root_screenshot(name):
    """The whole X screen (notifications are not part of any webview)."""
    if SHOTS:
        subprocess.run(["import", "-window", "root", os.path.join(SHOTS, name)], check=True, timeout=20)


def free_port():
    return free_ports(1)[0]


def free_ports(n):
    """n distinct free ports (each socket stays bound until all are known)."""
    held = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_driver(env):
    """tauri-driver and the WebKitWebDriver it starts, both listening. tauri-driver listens at
    once but starts WebKitWebDriver in the background: a new-session request forwarded before
    WebKitWebDriver listens is refused, and tauri-driver then closes the connection without an
    answer. So the session is opened only once the native port answers too."""
    port, native = free_ports(2)
    proc = subprocess.Popen(["tauri-driver", "--port", str(port), "--native-port", str(native)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for("tauri-driver", lambda: listening(port), 15)
        wait_for("WebKitWebDriver", lambda: listening(native), 15)
    except BaseException:
        proc.terminate()
        raise
    return proc, port


class Agent:
    """The MCP agent process (official Python SDK), driven by JSON lines."""

    def __init__(self, env):
        python = os.path.join(ROOT, "tests/clients/python/.venv/bin/python")
        self.proc = subprocess.Popen(
            [python, os.path.join(ROOT, "tests/clients/python/agent.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        self.backlog = []
        self.expect(lambda e: e["event"] == "ready")

    def send(self, cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def expect(self, pred):
        for i, e in enumerate(self.backlog):
            if pred(e):
                return self.backlog.pop(i)
        while True:
            line = self.proc.stdout.readline()
            check(line, "the agent exited")
            e = json.loads(line)
            if pred(e):
                return e
            self.backlog.append(e)

    def connect(self, env):
        self.send({"op": "connect", "transport": "stdio", "command": POSTERN, "args": ["mcp"], "env": env})
        e = self.expect(lambda e: e["event"] in ("connected", "connect_failed", "error"))
        check(e["event"] == "connected", f"connect: {e}")

    def call(self, tag, tool, arguments):
        self.send({"op": "call", "tag": tag, "tool": tool, "arguments": arguments})

    def result(self, tag):
        return self.expect(lambda e: e["event"] == "result" and e.get("tag") == tag)

    def bridge_pid(self):
        children = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        check(children, "the agent has a bridge process")
        return int(children[0])


def journal(env, execution=None):
    run = subprocess.run([POSTERN, "activity", "--json", "--limit", "10000"], capture_output=True, text=True, env=env)
    check(run.returncode == 0, run.stderr)
    rows = json.loads(run.stdout)
    return [r for r in rows if execution is None or r["execution_id"] == execution]


def shot(driver, name):
    """Saves what the current window shows. WebKitWebDriver's snapshot waits for the window to
    paint, which an idle window under Xvfb may not do (the main window's live indicator keeps it
    painting): skip rather than hang."""
    if not SHOTS:
        return
    os.makedirs(SHOTS, exist_ok=True)
    done = threading.Event()

    def take():
        try:
            driver.save_screenshot(os.path.join(SHOTS, name))
        finally:
            done.set()

    threading.Thread(target=take, daemon=True).start()
    if not done.wait(15):
        step(f"screenshot {name} did not complete")


class Browser:
    """Selenium with the window it means. WebKitWebDriver sometimes answers "no such window" for a
    window that exists while another webview opens or closes, and the live views re-render under
    a read; a command is then retried (after switching to its window again), at most 5 times."""

    def __init__(self, driver):
        self.driver = driver
        self.window = driver.current_window_handle

    def on(self, handle):
        self.window = handle
        self.do(lambda d: d.switch_to.window(handle))

    def do(self, f):
        for attempt in range(5):
            try:
                return f(self.driver)
            except StaleElementReferenceException:
                # The live views re-render; read again.
                if attempt == 4:
                    raise
                time.sleep(0.1)
                continue
            except NoSuchWindowException:
                if attempt == 4:
                    raise
                time.sleep(0.3)
                try:
                    self.driver.switch_to.window(self.window)
                except NoSuchWindowException:
                    pass

    def find(self, css):
        return self.do(lambda d: d.find_elements(By.CSS_SELECTOR, css))

    def text(self, css):
        return self.do(lambda d: d.find_element(By.CSS_SELECTOR, css).text)

    def click(self, css):
        self.do(lambda d: d.execute_script("arguments[0].scrollIntoView(); arguments[0].click()",
                                           d.find_element(By.CSS_SELECTOR, css)))

    def fill(self, css, value):
        """Types `value` into the input `css` (trusted key events), then leaves it (a change event)."""
        def typed(d):
            field = d.find_element(By.CSS_SELECTOR, css)
            field.clear()
            field.send_keys(value)
            d.execute_script("arguments[0].dispatchEvent(new Event('change', {bubbles: true}))", field)
        self.do(typed)


    def armed(self):
        """Waits until the dialog takes answers (it ignores keys and clicks for its arming delay)."""
        wait_for("the dialog to arm", lambda: self.do(
            lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=armed]").get_attribute("data-armed")) == "true")

    def keys(self, text):
        """Types into the focused dialog as a user would (trusted key events)."""
        try:
            self.do(lambda d: ActionChains(d).send_keys(text).perform())
        except WebDriverException as e:
            step(f"the dialog closed while typing ({type(e).__name__})")

    def in_view(self, css):
        """Whether every element `css` matches lies wholly inside the window as it is shown,
        without scrolling anything."""
        return self.do(lambda d: d.execute_script(
            "const els = [...document.querySelectorAll(arguments[0])];"
            "return els.length > 0 && els.every(e => { const r = e.getBoundingClientRect();"
            " return r.top >= 0 && r.left >= 0 && r.bottom <= window.innerHeight && r.right <= window.innerWidth; });",
            css))

    def answer(self, css):
        """Clicks a dialog's answer with a real (WebDriver) click once the dialog is armed — a
        scripted click is not trusted and answers nothing. The app closes the dialog as soon as
        the answer arrives, so the click's result may never come back; the caller checks the
        effect instead."""
        self.armed()
        try:
            self.driver.find_element(By.CSS_SELECTOR, css).click()
        except WebDriverException as e:
            step(f"the dialog closed while answering ({type(e).__name__})")


def new_window(b, known):
    handle = wait_for("an approval window", lambda: [h for h in b.do(lambda d: d.window_handles) if h not in known])[0]
    b.on(handle)
    wait_for("the dialog to load", lambda: b.find("[data-testid=dialog-rows]"))
    return handle


def rows_of(b):
    def read(d):
        table = d.find_element(By.CSS_SELECTOR, "[data-testid=dialog-rows]")
        return {
            tr.find_element(By.TAG_NAME, "th").text: tr.find_element(By.TAG_NAME, "td").text
            for tr in table.find_elements(By.TAG_NAME, "tr")
        }

    return b.do(read)


def main():
    figures = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Target)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    data = tempfile.mkdtemp(prefix="postern-desktop-")
    TEMPORARY.append(data)
    tools = os.path.join(data, "tools.toml")
    with open(tools, "w") as f:
        f.write(
            f'[[tool]]\nname = "pay_each"\nmethod = "POST"\nurl = "{base}/pay"\ncredential = "bank"\n'
            'input_schema = { type = "object", properties = { amount = { type = "integer" } } }\n'
            'contract = { class = "irreversible" }\n\n'
            f'[[tool]]\nname = "wire"\nmethod = "POST"\nurl = "{base}/wire"\n'
            'input_schema = { type = "object", properties = { amount = { type = "integer" } } }\n'
            'contract = { class = "irreversible" }\n\n'
            f'[[tool]]\nname = "vanish"\nmethod = "POST"\nurl = "{base}/vanish"\n'
            'input_schema = { type = "object", properties = { amount = { type = "integer" } } }\n'
            'contract = { class = "irreversible" }\n'
        )
    config = tempfile.mkdtemp(prefix="postern-desktop-config-")
    TEMPORARY.append(config)
    env = dict(os.environ, POSTERN_DATA_DIR=data, POSTERN_TOOLS=tools, POSTERN_PORT="0",
               WEBKIT_DISABLE_DMABUF_RENDERER="1", NO_COLOR="1", XDG_CONFIG_HOME=config)
    add = subprocess.run(
        [POSTERN, "vault", "add", "bank", "--kind", "bearer", "--host", "127.0.0.1", "--approve-every-use"],
        input=SECRET + "\n", capture_output=True, text=True, env=env,
    )
    check(add.returncode == 0, add.stderr)
    # An upstream MCP server (the counting server on the official Python SDK), its token a
    # keychain secret: the Servers view shows it running, with its tools' contracts.
    counter = tempfile.mkdtemp(prefix="postern-desktop-counter-")
    TEMPORARY.append(counter)
    with open(os.path.join(counter, "expected_token"), "w") as f:
        f.write(UPSTREAM_SECRET)
    python = os.path.join(ROOT, "tests/clients/python/.venv/bin/python")
    up = subprocess.run(
        [POSTERN, "servers", "add", "counter", "--env", f"COUNTER_DIR={counter}", "--secret-env", "COUNTER_TOKEN", "--",
         python, os.path.join(ROOT, "tests/upstreams/counting.py")],
        input=UPSTREAM_SECRET + "\n", capture_output=True, text=True, env=env,
    )
    check(up.returncode == 0, up.stderr)
    # A remote server behind the Python SDK's own OAuth authorization server: signed in from the
    # Servers view (the test plays the browser; BROWSER=true keeps xdg-open from opening one).
    oauth_dir = tempfile.mkdtemp(prefix="postern-desktop-oauth-")
    TEMPORARY.append(oauth_dir)
    oauth_port = free_port()
    oauth = subprocess.Popen([python, os.path.join(ROOT, "tests/upstreams/counting.py"), "--oauth", str(oauth_port)],
                             env=dict(os.environ, COUNTER_DIR=oauth_dir, OAUTH_TTL="2"), stdin=subprocess.DEVNULL)
    wait_for("the OAuth server", lambda: listening(oauth_port), 20)
    env["BROWSER"] = "true"

    driver_proc = None
    agent = None
    driver = None
    notes = Notifications()
    try:
        driver_proc, port = start_driver(env)
        opts = ArgOptions()
        opts.set_capability("browserName", "wry")
        opts.set_capability("tauri:options", {"application": APP})
        started = time.time()
        step("opening the WebDriver session")
        driver = webdriver.Remote(command_executor=f"http://127.0.0.1:{port}", options=opts)
        b = Browser(driver)
        main_window = b.window
        wait_for("the main window", lambda: b.find("[data-testid=vault-state]"))
        figures["main_window_ready_ms"] = round((time.time() - started) * 1000)
        check(b.find("[data-testid=approvals-empty]"), "no approvals yet")
        wait_for("the first-run panel", lambda: b.find("[data-testid=first-run]"))
        check("claude mcp add postern -- postern mcp" in b.text("[data-testid=first-run]"), "the connect line")
        shot(driver, "view-first-run.png")

        # Scenario 1: per-use approval.
        step("starting the agent")
        agent = Agent(env)
        agent.connect(env)
        step("calling pay_each")
        agent.call("x", "pay_each", {"amount": 5})
        dialog = new_window(b, [main_window])
        # Keys typed the moment the dialog appears (typing meant for another window) answer
        # nothing, and keep it disarmed; once armed, the same key answers.
        step("typing into the dialog before it is armed")
        b.keys("yyy")
        state = b.do(lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=armed]"))
        armed, ignored = b.do(lambda d: (state.get_attribute("data-armed"), state.get_attribute("data-ignored")))
        check(armed == "false" and int(ignored) >= 1, f"the early keys were ignored (armed {armed}, ignored {ignored})")
        time.sleep(0.3)
        check(Target.posts == 0 and dialog in b.do(lambda d: d.window_handles), "early keys answered nothing")
        check(b.text("[data-testid=dialog-title]").lower() == "approve this call", "per-use title")
        shown = rows_of(b)
        check(shown["request"] == f"POST {base}/pay", shown)
        check(shown["credential"] == "bank", shown)
        check(shown["body"] == '{"amount":5}', shown)
        check(SECRET not in b.do(lambda d: d.page_source), "the secret is never shown")
        check(int(b.text("[data-testid=countdown]").split()[0]) > 100, "a countdown")
        check(b.in_view("button[data-key]"), "the choices are visible without scrolling")
        check(Target.posts == 0, "nothing is sent while the reviewer decides")
        # Another window of the app (here the main one) cannot answer the question.
        question = b.do(lambda d: d.current_url).rsplit("/approval/", 1)[1]
        b.on(main_window)
        refused = b.do(lambda d: d.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "window.__TAURI_INTERNALS__.invoke('answer_approval', {id: arguments[0], key: 'y', reason: null})"
            ".then(() => done('answered'), (e) => done(JSON.stringify(e)));", question))
        # Refused by the capability (answer_approval is granted to approval-* windows only); the
        # command itself also checks that a question is answered in its own window.
        check("not allowed on window" in refused or "approval_wrong_window" in refused,
              f"the main window cannot answer: {refused}")
        b.on(dialog)
        shot(driver, "dialog-per-use.png")
        # The question raised a notification; with the focus elsewhere, clicking it brings the
        # dialog forward.
        notes.wait("Postern: approval needed")
        root_screenshot("notification-approval.png")
        dialog_title = next((n for n in window_names() if n.startswith("Postern — ")), None)
        check(dialog_title, f"the dialog's X window: {window_names()}")
        focus_window_named("Postern")
        wait_for("the focus on the main window", lambda: focused_window_name() == "Postern", 10)
        notes.activate_newest()
        wait_for("the dialog focused by the notification", lambda: focused_window_name() == dialog_title, 10)
        step("approving with the key, once armed")
        b.armed()
        b.keys("y")
        x = agent.result("x")
        check(x["ok"] and x["structured"]["state"] == "completed", x)
        check(Target.posts == 1, f"the target counted {Target.posts}")
        wait_for("the dialog to close", lambda: dialog not in b.do(lambda d: d.window_handles))
        execution = x["structured"]["execution_id"]
        events = [r["event"] for r in journal(env, execution)]
        check(events[:5] == ["accepted", "approval_requested", "approval_granted", "authorized", "dispatched"], events)

        b.on(main_window)
        b.click("button[data-view=Activity]")
        wait_for("the call in Activity", lambda: b.find(f"[data-execution='{execution}']"))
        b.click(f"[data-execution='{execution}']")
        wait_for("the timeline", lambda: b.find("[data-testid=timeline]"))
        timeline = b.text("[data-testid=timeline]")
        calls = b.text("[data-testid=calls]")
        check("first" in calls and "ses_" in calls, f"the incident's calls in the detail pane: {calls}")
        target = b.text("[data-testid=target]")
        check(target.startswith("POST http://127.0.0.1"), f"the target in the detail pane: {target}")
        for event in ["accepted", "approval_requested", "approval_granted", "authorized", "dispatched", "completed"]:
            check(event in timeline, f"{event} in the timeline: {timeline}")

        # Scenario 2: retry review.
        step("scenario 2")
        bridge = agent.bridge_pid()
        Target.hold.set()
        agent.call("first", "wire", {"amount": 900})
        dialog = new_window(b, [main_window])
        check(b.text("[data-testid=dialog-title]").lower() == "authorize an agent run", "session title")
        shown = rows_of(b)
        check(shown["pid"].startswith(str(agent.proc.pid)), shown)
        check(shown["transport"] == "stdio", shown)
        shot(driver, "dialog-session.png")
        # The agent runs as python3: an interpreter runs any script, so "always allow" (bound to
        # the executable's hash) is not offered, and the reviewer is told why; its key answers
        # nothing. (For an agent that is a program of its own it takes a second, confirming
        # click: ApprovalDialog.test.ts.)
        check(not b.find("button[data-key=a]"), "no 'always allow' for an interpreter")
        check("interpreter" in shown.get("note", ""), shown)
        b.armed()
        b.keys("a")
        time.sleep(0.3)
        check(Target.posts == 1 and dialog in b.do(lambda d: d.window_handles), "'a' answered nothing")
        b.answer("button[data-key=s]")
        wait_for("the wire to reach the target", lambda: Target.posts == 2)
        os.kill(bridge, 9)
        check(not agent.result("first")["ok"], "the first call's connection was cut")
        Target.hold.clear()
        wire = wait_for("the wire execution", lambda: [r["execution_id"] for r in journal(env) if r["event"] == "accepted" and r["detail"]["tool"] == "wire"])[0]
        wait_for("the undelivered result", lambda: journal(env, wire)[-1]["event"] == "completed_result_not_delivered")
        b.on(main_window)
        agent.connect(env)
        step("retrying wire")
        agent.call("retry", "wire", {"amount": 900})
        dialog = new_window(b, [main_window])
        check(b.text("[data-testid=dialog-title]").lower() == "review a retry", "review title")
        shown = rows_of(b)
        check(shown["original"].startswith(wire), shown)
        check(shown["state"] == "completed_result_not_delivered", shown)
        check(shown["authorized"] == "by desktop", shown)
        check("dispatched" in shown, shown)
        check(shown["outcome"].startswith("completed with HTTP 201"), shown)
        check(shown["not re-sent"].startswith("the original completed"), shown)
        timeline = b.text("[data-testid=dialog-timeline]")
        check("dispatched" in timeline and "completed_result_not_delivered" in timeline, timeline)
        check(not b.find("button[data-key=c]"), "no status route for irreversible")
        # At the default size the record is long; the choices and the countdown stay in view.
        check(b.in_view("button[data-key]") and b.in_view("[data-testid=countdown]"),
              "the retry review's choices and countdown are visible without scrolling")
        shot(driver, "dialog-retry-review.png")
        b.answer("button[data-key=r]")
        retry = agent.result("retry")
        check(retry["ok"] and retry["structured"]["execution_id"] == wire, retry)
        check(retry["structured"]["attached"] is True, retry)
        check(Target.posts == 2, f"the wire was sent once (target counted {Target.posts} POSTs in all)")
        # A call whose target takes the request and hangs up: nobody knows whether it happened.
        # The app watches the journal and raises a notification.
        agent.call("vanish", "vanish", {"amount": 1})
        vanished = agent.result("vanish")
        check(vanished.get("structured", {}).get("state") == "outcome_unknown", vanished)
        check(Target.vanished == 1, f"the vanishing target was reached once ({Target.vanished})")
        notes.wait("Postern: an outcome needs review")

        # Activity: each state a badge (the uncertain one stands out), the legend, and the
        # first call's lifecycle in the detail pane.
        b.on(main_window)
        b.click("button[data-view=Activity]")
        gone = vanished["structured"]["execution_id"]
        wait_for("the vanished call in Activity", lambda: b.find(f"[data-execution='{gone}']"))
        b.click(f"[data-execution='{execution}']")
        wait_for("the timeline", lambda: b.find("[data-testid=timeline]"))
        groups = b.do(lambda d: [e.get_attribute("data-group") for e in
                                 d.find_elements(By.CSS_SELECTOR, "[data-testid=state] [data-group]")])
        check("uncertain" in groups and "done" in groups, f"state badges by group: {groups}")
        check("needs a look" in b.text("[data-testid=legend]"), "the legend")
        shot(driver, "view-activity.png")

        b.on(main_window)
        b.click("button[data-view=Sessions]")
        wait_for("the Sessions view", lambda: b.find("[data-testid=sessions]"))
        shot(driver, "view-sessions.png")
        b.click("button[data-view=Approvals]")
        b.click("button[data-view=Vault]")
        wait_for("the Vault view", lambda: b.find("[data-testid=credentials]"))
        vault = b.text("[data-testid=credentials]")
        check("bank" in vault and "127.0.0.1" in vault and "yes" in vault, vault)
        check(SECRET not in b.do(lambda d: d.page_source), "the vault view never shows a secret")
        shot(driver, "view-vault.png")
        b.click("button[data-view=Tools]")
        wait_for("the Tools view", lambda: b.find("[data-testid=tools]"))
        tools_text = b.text("[data-testid=tools]")
        check("pay_each" in tools_text and "irreversible" in tools_text and "destructiveHint" in tools_text, tools_text)
        shot(driver, "view-tools.png")
        b.click("button[data-view=Servers]")
        wait_for("the upstream server running", lambda: b.find("[data-testid=server-state-counter]")
                 and b.text("[data-testid=server-state-counter]") == "running")
        server_text = b.text("[data-testid=server-counter]")
        check("counter__pay" in server_text and "COUNTER_TOKEN" in server_text, server_text)
        chosen = lambda tool: b.do(lambda d: d.execute_script(  # noqa: E731
            "return arguments[0].selectedOptions[0].textContent",
            d.find_element(By.CSS_SELECTOR, f"[data-testid='contract-{tool}']")))
        check(chosen("counter__pay").startswith("irreversible"), chosen("counter__pay"))
        check(b.text("[data-testid='contract-from-counter__pay']") == "no hint (Postern's default)",
              b.text("[data-testid='contract-from-counter__pay']"))
        check(UPSTREAM_SECRET not in b.do(lambda d: d.page_source), "the Servers view never shows a secret")
        shot(driver, "view-servers.png")
        # The owner holds the tool to a contract of their own: kept in the vault, offered at once.
        b.do(lambda d: d.execute_script(
            "arguments[0].value = 'idempotent'; arguments[0].dispatchEvent(new Event('change', {bubbles: true}))",
            d.find_element(By.CSS_SELECTOR, "[data-testid='contract-counter__pay']")))
        wait_for("the owner's contract", lambda: b.text("[data-testid='contract-from-counter__pay']") == "set by you")
        check(chosen("counter__pay").startswith("idempotent"), chosen("counter__pay"))
        # Add the OAuth server from the form: asked, it answers 401 naming its resource metadata,
        # so the form offers OAuth (checked) and "Add and sign in" starts the sign-in at once: the
        # view shows the link, the browser (this test) follows it to Postern's loopback listener,
        # and the server runs with its tools.
        b.click("[data-testid=add-server]")
        b.fill("[data-testid=server-form] input[placeholder^=name]", "remote")
        b.click("[data-testid=server-remote-kind]")
        b.fill("[data-testid=server-url]", f"http://127.0.0.1:{oauth_port}/mcp")
        wait_for("the OAuth offer", lambda: b.find("[data-testid=server-probe]")
                 or (b.find("[data-testid=server-probe-error]") and check(False, b.text("[data-testid=server-probe-error]"))))
        check("signs in with OAuth at http://127.0.0.1" in b.text("[data-testid=server-probe]"),
              b.text("[data-testid=server-probe]"))
        check(b.do(lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=server-oauth]").is_selected()),
              "OAuth is offered checked")
        check("Add and sign in" in b.text("[data-testid=server-add]"), b.text("[data-testid=server-add]"))
        b.click("[data-testid=server-add]")
        wait_for("the sign-in link", lambda: b.find("[data-testid=sign-in-url-remote]")
                 or (b.find("[data-testid=servers-error]") and check(False, b.text("[data-testid=servers-error]"))))
        link = b.do(lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=sign-in-url-remote]").get_attribute("href"))
        import urllib.request
        page = urllib.request.urlopen(link, timeout=20).read().decode()
        check("Signed in" in page, page)
        wait_for("the sign-in result", lambda: b.find("[data-testid=servers-signed-in]"))
        check("signed in" in b.text("[data-testid=servers-signed-in]"), b.text("[data-testid=servers-signed-in]"))
        wait_for("the signed-in server running", lambda: b.find("[data-testid=server-state-remote]")
                 and b.text("[data-testid=server-state-remote]") == "running")
        check("remote__balance" in b.text("[data-testid=server-remote]"), b.text("[data-testid=server-remote]"))
        with open(os.path.join(oauth_dir, "issued_tokens.txt")) as f:
            issued = [t for t in f.read().split() if t]
        source = b.do(lambda d: d.page_source)
        check(issued and not any(t in source for t in issued), "the Servers view never shows a token")
        # The grant is revoked at the server: once the token expires, a call is refused without
        # being sent, and the desktop says the server needs a new sign-in.
        open(os.path.join(oauth_dir, "oauth_revoke_all"), "w").close()
        time.sleep(3)
        agent.call("stale", "remote__balance", {})
        stale = agent.result("stale")
        check("oauth_login_required" in json.dumps(stale), stale)
        notes.wait("Postern: sign-in needed")
        # Start at login: the Settings switch writes and removes the XDG autostart entry.
        b.click("button[data-view=Settings]")
        wait_for("the Settings view", lambda: b.find("[data-testid=autostart]"))
        entry = os.path.join(config, "autostart", "postern.desktop")
        check(not os.path.exists(entry), "no autostart entry yet")
        b.click("[data-testid=autostart]")
        wait_for("the autostart entry", lambda: os.path.exists(entry))
        with open(entry) as f:
            text = f.read()
        check(f"\nExec={APP}\n" in text or f'\nExec="{APP}"\n' in text, text)
        b.click("[data-testid=autostart]")
        wait_for("the autostart entry removed", lambda: not os.path.exists(entry))
        b.click("button[data-view=Audit]")
        b.click("[data-testid=verify]")
        wait_for("the audit", lambda: b.find("[data-testid=audit-result]"))
        audit = b.text("[data-testid=audit-result]")
        check(audit.startswith("INTACT"), audit)
        b.click("[data-testid=checkpoint]")
        wait_for("the checkpoint", lambda: b.find("[data-testid=checkpoint-json]"))
        note = b.text("[data-testid=checkpoint-json]")
        check(note.startswith("postern/inst_") and "\u2014 postern/inst_" in note, f"a signed checkpoint note: {note!r}")
        shot(driver, "view-audit.png")
        b.click("button[data-view=Approvals]")
        # Quick lock from the window, then unlock there (the approver's own channel).
        b.click("[data-testid=lock]")
        wait_for("the lock", lambda: b.text("[data-testid=vault-state]") == "vault locked")
        notes.wait("Postern: vault locked")
        agent.call("locked", "wire", {"amount": 1})
        denied = agent.result("locked")
        check(denied["structured"]["detail"]["rung"] == "vault_locked", denied)
        b.click("[data-testid=unlock]")
        wait_for("the unlock", lambda: b.text("[data-testid=vault-state]") == "vault unlocked")
        check(Target.posts == 2, "nothing was sent while locked")
        driver.quit()
        driver = None
        if os.environ.get("BENCH_ROWS"):
            figures.update(bench_activity(int(os.environ["BENCH_ROWS"])))
        print(json.dumps({"ok": True, **figures}))
    finally:
        notes.stop()
        if agent:
            agent.proc.kill()
        if driver:
            driver.quit()
        if driver_proc:
            driver_proc.terminate()
        server.shutdown()
        oauth.kill()


def bench_activity(rows):
    """The Activity view on a journal of `rows` executions: time to first render (the view
    opened until its first page is on screen) and to apply a state filter. Printed, never
    asserted. The executions are written straight into the journal's `executions` table (the
    view reads that projection; the journal rows behind them are not what it touches)."""
    import sqlite3

    data = tempfile.mkdtemp(prefix="postern-bench-")
    TEMPORARY.append(data)
    env = dict(os.environ, POSTERN_DATA_DIR=data, POSTERN_PORT="0", WEBKIT_DISABLE_DMABUF_RENDERER="1", NO_COLOR="1")
    env.pop("POSTERN_TOOLS", None)
    created = subprocess.run([POSTERN, "status"], capture_output=True, text=True, env=env)
    check(created.returncode == 0, created.stderr)
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

    def ulid(ms, n):
        value = (ms << 80) | n
        return "act_" + "".join(alphabet[(value >> (5 * i)) & 31] for i in range(25, -1, -1))

    states = ["result_delivered"] * 97 + ["outcome_unknown", "needs_review", "denied"]
    tools = ["create_payment", "deploy", "http_request", "ssh_exec"]
    step(f"seeding {rows} executions")
    db = sqlite3.connect(os.path.join(data, "postern.db"))
    db.execute("PRAGMA synchronous = OFF")
    t0 = 1_764_460_800_000
    db.executemany(
        "INSERT INTO executions (id, fingerprint, actor, intent_scope, session_id, tool, channel, state, accepted_at,"
        " updated_at, contract, record) VALUES (?, ?, 'process:/usr/bin/agent@sha256:ab', 'run:x', NULL, ?, 'http', ?,"
        " ?, ?, '{\"class\":\"irreversible\"}', '{}')",
        ((ulid(t0 + n, n + 1), f"hmac-sha256:{n:064x}", tools[n % 4], states[n % 100], t0 + n, t0 + n) for n in range(rows)),
    )
    db.commit()
    db.close()
    driver_proc = None
    driver = None
    try:
        driver_proc, port = start_driver(env)
        opts = ArgOptions()
        opts.set_capability("browserName", "wry")
        opts.set_capability("tauri:options", {"application": APP})
        driver = webdriver.Remote(command_executor=f"http://127.0.0.1:{port}", options=opts)
        b = Browser(driver)
        wait_for("the main window", lambda: b.find("[data-testid=vault-state]"))
        started = time.time()
        b.click("button[data-view=Activity]")
        wait_for("the first page", lambda: b.find("[data-execution]") and b.text("[data-testid=loaded-count]") == "100", 120)
        first_render = time.time() - started
        started = time.time()
        b.do(lambda d: d.execute_script(
            "const s = document.querySelector('[data-testid=state-filter]'); s.value = 'needs_review';"
            "s.dispatchEvent(new Event('change', { bubbles: true }));"
            "document.querySelector('[data-testid=search]').form.requestSubmit();"))
        def filtered_page():
            states = b.do(lambda d: d.execute_script(
                "return [...document.querySelectorAll('[data-execution] [data-testid=state]')].map(e => e.textContent)"))
            return states and all(st == "needs_review" for st in states) and b.text("[data-testid=loaded-count]") == "100"

        wait_for("the filtered page", filtered_page, 120)
        filtered = time.time() - started
        return {"bench_rows": rows, "activity_first_render_ms": round(first_render * 1000),
                "activity_filter_ms": round(filtered * 1000)}
    finally:
        if driver:
            driver.quit()
        if driver_proc:
            driver_proc.terminate()


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(int(os.environ.get("E2E_HANG_DUMP_S", "240")), exit=True)
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        for path in TEMPORARY:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):
                os.remove(path)
