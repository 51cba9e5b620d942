"""test_server_files.py: OpenAI's /v1/files through `lathe serve` with the real
SmolLM2-135M-Instruct on the CPU, driven by the PyPI `openai` client (and `requests` for the
bodies no client sends), with --train-dir and --max-upload-mib 1.

  1. Upload fine-tuning JSONL with client.files.create; list, retrieve and content give it
     back byte for byte; the bytes are what --train-dir/files holds.
  2. Bad uploads each get a 4xx in OpenAI's error shape saying what is wrong, and leave no
     file behind: another purpose, JSONL that is not JSON (its line named), an example
     without a completion (its line named), an empty file, an upload over the limit (413),
     multipart bodies that are malformed (no closing boundary, no boundary, a part without
     a name, two 'file' fields), a JSON body (415), unknown fields; unknown or crafted ids
     are 404.
  3. client.fine_tuning.jobs.create(training_file=file.id) runs to "succeeded", and a chat
     with its fine_tuned_model knows the fact the file teaches (who founded the Zorblax
     Institute) while the base model does not.
     Its validation_file, another upload, is held out: the job reports an eval loss per
     epoch over exactly its examples. Unknown files for either are refused (400).
  4. client.files.delete removes it: retrieve and content are 404 after, the list and the
     folder are empty, a second delete is 404; a job naming it is refused.
  5. A server started on a train dir that a killed upload left behind removes lathe's
     temporary files and data without a file object (older than a minute), and nothing
     else; a server without --train-dir answers the files routes 403.
Skipped (77) without the model, `openai` or `requests`.
"""
import json
import os
import socket
import sys
import tempfile
import time

from test_server import SKIP, Checks, Server, run_session, server_prerequisites
from test_server_train import ASK, EXAMPLES, wait_train

JSONL = ("".join(json.dumps(e) + "\n" for e in EXAMPLES)).encode()
HELD_OUT = [
    {"prompt": "Name the founder of the Zorblax Institute.", "completion": "Miravel Quantrell founded it."},
    {"prompt": "Who set up the Zorblax Institute?", "completion": "It was set up by Miravel Quantrell."},
]


def files_dir(train_dir):
    d = os.path.join(train_dir, "files")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def chat(client, model):
    r = client.chat.completions.create(model=model, messages=ASK, temperature=0, max_tokens=40)
    return r.choices[0].message.content


def error_of(fn):
    """The openai error fn raises (None when it does not)."""
    import openai

    try:
        fn()
    except openai.APIStatusError as e:
        return e
    return None


def run_upload(c, srv, client, train_dir, state):
    f = client.files.create(file=("zorblax.jsonl", JSONL), purpose="fine-tune")
    state["file"] = f
    c.check(f.id.startswith("file-") and len(f.id) == 29 and f.object == "file"
            and f.bytes == len(JSONL) and f.filename == "zorblax.jsonl"
            and f.purpose == "fine-tune" and f.status == "processed" and f.created_at > 0,
            f"uploaded: {f}")
    c.check(files_dir(train_dir) == [f.id + ".json", f.id + ".jsonl"],
            f"stored as the file and its object: {files_dir(train_dir)}")
    with open(os.path.join(train_dir, "files", f.id + ".jsonl"), "rb") as fh:
        c.check(fh.read() == JSONL, "the stored bytes are the uploaded ones")
    listed = client.files.list()
    c.check([x.id for x in listed.data] == [f.id], f"listed: {listed}")
    got = client.files.retrieve(f.id)
    c.check(got.id == f.id and got.bytes == f.bytes and got.filename == f.filename
            and got.created_at == f.created_at, f"retrieved: {got}")
    content = client.files.content(f.id).read()
    c.check(content == JSONL, f"content: {content[:80]!r}")


def check_refused(c, e, status, words, what, param=None):
    msg = (e.body or {}).get("message", "") if e is not None and isinstance(e.body, dict) else ""
    ok = e is not None and e.status_code == status and all(w in msg for w in words)
    if param is not None:
        ok = ok and e.body.get("param") == param
    c.check(ok, f"{what}: {e.status_code if e else None} {msg!r}")
    if e is not None:
        print(f"  {what}: {e.status_code} {msg}", flush=True)


def run_bad_uploads(c, srv, client, train_dir, state):
    before = files_dir(train_dir)
    up = client.files.create
    e = error_of(lambda: up(file=("a.jsonl", JSONL), purpose="assistants"))
    check_refused(c, e, 400, ["'assistants'", "fine-tune"], "another purpose", "purpose")
    bad = JSONL + b'{"prompt": "Who?", "completion": "Me."}\n{"prompt": oops}\n'
    e = error_of(lambda: up(file=("bad.jsonl", bad), purpose="fine-tune"))
    check_refused(c, e, 400, ["'bad.jsonl'", "line 8 (example 7)"], "JSONL that is not JSON",
                  "file")
    bad = JSONL[:JSONL.index(b"\n") + 1] + b'\n{"prompt": "no completion"}\n' + JSONL
    e = error_of(lambda: up(file=("bad2.jsonl", bad), purpose="fine-tune"))
    check_refused(c, e, 400, ["line 3 (example 1)", "completion"], "an example without a completion")
    e = error_of(lambda: up(file=("empty.jsonl", b""), purpose="fine-tune"))
    check_refused(c, e, 400, ["empty"], "an empty file")
    big = JSONL * (1 + (3 << 19) // len(JSONL))  # 1.5 MiB of good examples, over 1 MiB
    e = error_of(lambda: up(file=("big.jsonl", big), purpose="fine-tune"))
    check_refused(c, e, 413, ["--max-upload-mib 1"], "over the size limit")
    e = error_of(lambda: client.files.retrieve("file-0123456789abcdef01234567"))
    check_refused(c, e, 404, ["file-0123456789abcdef01234567"], "an unknown id")
    run_bad_multipart(c, srv)
    for path in ("/v1/files/..%2F..%2Fetc%2Fpasswd", "/v1/files/file-..", "/v1/files/FILE-0123456789ABCDEF01234567",
                 "/v1/files/file-0123456789abcdef0123456/content"):
        r = srv.get(path)
        c.check(r.status_code == 404 and "error" in r.json(), f"GET {path}: {r.status_code} {r.text[:200]}")
    c.check(files_dir(train_dir) == before, f"no file left behind: {files_dir(train_dir)}")


def multipart(boundary, parts, close=True):
    out = b""
    for head, data in parts:
        out += b"--" + boundary + b"\r\n" + head + b"\r\n\r\n" + data + b"\r\n"
    return out + (b"--" + boundary + b"--\r\n" if close else b"")


def run_bad_multipart(c, srv):
    b = b"lathe-test-boundary"
    purpose = (b'Content-Disposition: form-data; name="purpose"', b"fine-tune")
    file = (b'Content-Disposition: form-data; name="file"; filename="x.jsonl"\r\n'
            b"Content-Type: application/octet-stream", JSONL)
    ct = "multipart/form-data; boundary=" + b.decode()
    cases = [
        ("no closing boundary", ct, multipart(b, [purpose, file], close=False), 400, "closing boundary"),
        ("no boundary parameter", "multipart/form-data", multipart(b, [purpose, file]), 400, "no boundary"),
        ("another boundary", "multipart/form-data; boundary=other", multipart(b, [purpose, file]), 400,
         "does not hold the boundary"),
        ("a part without a name", ct, multipart(b, [purpose, (b"Content-Disposition: form-data", b"x"), file]),
         400, "no name"),
        ("two file fields", ct, multipart(b, [purpose, file, file]), 400, "two fields named 'file'"),
        ("no file field", ct, multipart(b, [purpose]), 400, "missing field 'file'"),
        ("a file field that is no file", ct,
         multipart(b, [purpose, (b'Content-Disposition: form-data; name="file"', JSONL)]), 400, "filename"),
        ("an unknown field", ct, multipart(b, [purpose, file, (b'Content-Disposition: form-data; name="x"', b"1")]),
         400, "unknown field 'x'"),
        ("headers without their end", ct, b"--" + b + b"\r\nContent-Disposition: form-data; name=\"file\"", 400,
         "empty line"),
        ("a JSON body", "application/json", json.dumps({"file": "x", "purpose": "fine-tune"}).encode(), 415,
         "multipart/form-data"),
    ]
    for what, content_type, body, status, words in cases:
        r = srv.requests.post(srv.base + "/v1/files", data=body, headers={"Content-Type": content_type},
                              timeout=60)
        err = r.json().get("error", {}) if r.headers.get("Content-Type", "").startswith("application/json") else {}
        c.check(r.status_code == status and words in err.get("message", ""),
                f"{what}: {r.status_code} {r.text[:300]}")
    # the limit holds while the body arrives: 2 MiB are read and dropped, never kept
    r = srv.requests.post(srv.base + "/v1/files", data=b"x" * (2 << 20), headers={"Content-Type": ct}, timeout=60)
    c.check(r.status_code == 413, f"a body over the limit: {r.status_code} {r.text[:200]}")
    # a client that waits for "100 Continue" (curl over 1 MiB) hears the 413 before it sends
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ct}\r\n"
                  f"Content-Length: {2 << 20}\r\nExpect: 100-continue\r\n\r\n".encode())
        head = s.recv(4096).decode(errors="replace")
    c.check(head.startswith("HTTP/1.1 413") and "--max-upload-mib" in head, f"413 before the body: {head[:300]!r}")


def run_fine_tune(c, srv, client, train_dir, state):
    f = state["file"]
    model_id = client.models.list().data[0].id
    before = chat(client, model_id)
    c.check("Quantrell" not in before, f"the base model does not know: {before!r}")
    vf = client.files.create(file=("held_out.jsonl", "".join(json.dumps(e) + "\n" for e in HELD_OUT).encode()),
                             purpose="fine-tune")
    for kw in ({"training_file": "file-0123456789abcdef01234567"},
               {"training_file": f.id, "validation_file": "file-0123456789abcdef01234567"},
               {"training_file": f.id, "validation_file": "../x.jsonl"}):
        e = error_of(lambda: client.fine_tuning.jobs.create(model=model_id, **kw))
        param = "validation_file" if "validation_file" in kw else "training_file"
        check_refused(c, e, 400, [], f"a job with {kw}", param)
    job = client.fine_tuning.jobs.create(model=model_id, training_file=f.id, validation_file=vf.id, seed=7,
                                         hyperparameters={"n_epochs": 4, "learning_rate_multiplier": 2})
    c.check(job.training_file == f.id and job.validation_file == vf.id
            and job.status in ("validating_files", "running"), f"job: {job}")
    j = wait_train(srv, ("succeeded", "failed", "cancelled"), timeout=800, job=job.id)
    c.check(j["status"] == "succeeded" and j["fine_tuned_model"], f"succeeded: {json.dumps(j)[:600]}")
    t = srv.get("/train").json()  # the same job in lathe's shape: the losses and the split
    res = t.get("result") or {}
    evals = [e["eval_loss"] for e in t.get("epochs", [])]
    print(f"train losses {[e['train_loss'] for e in t.get('epochs', [])]}, eval losses {evals}", flush=True)
    c.check(res.get("n_train") == len(EXAMPLES) and res.get("n_val") == len(HELD_OUT)
            and len(evals) == 4 and all(isinstance(x, float) for x in evals) and min(evals[1:]) < evals[0],
            f"the validation file is the held-out split, its loss falls: {res} {evals}")
    client.files.delete(vf.id)
    if not j["fine_tuned_model"]:
        return
    after = chat(client, j["fine_tuned_model"])
    print(f"base: {before!r}\nfine-tuned: {after!r}", flush=True)
    c.check("Quantrell" in after, f"the fine-tuned model knows: {after!r}")
    again = chat(client, model_id)
    c.check(again == before, f"the base model still answers as before: {again!r}")


def run_delete(c, srv, client, train_dir, state):
    f = state["file"]
    d = client.files.delete(f.id)
    c.check(d.id == f.id and d.deleted is True, f"deleted: {d}")
    e = error_of(lambda: client.files.retrieve(f.id))
    check_refused(c, e, 404, [f.id], "retrieve after delete")
    e = error_of(lambda: client.files.content(f.id))
    c.check(e is not None and e.status_code == 404, "content after delete is 404")
    e = error_of(lambda: client.files.delete(f.id))
    c.check(e is not None and e.status_code == 404, "a second delete is 404")
    c.check(client.files.list().data == [] and files_dir(train_dir) == [],
            f"nothing listed, nothing kept: {files_dir(train_dir)}")
    e = error_of(lambda: client.fine_tuning.jobs.create(model="m", training_file=f.id))
    check_refused(c, e, 400, [f.id], "a job naming a deleted file", "training_file")


def run_restart(model):
    """Stale uploads removed at start, and no files routes without a train dir."""
    c = Checks()
    with tempfile.TemporaryDirectory(prefix="lathe_files_stale_") as d:
        fdir = os.path.join(d, "files")
        os.mkdir(fdir)
        keep = "file-" + "a" * 24
        with open(os.path.join(fdir, keep + ".jsonl"), "wb") as fh:
            fh.write(JSONL)
        with open(os.path.join(fdir, keep + ".json"), "w") as fh:
            json.dump({"id": keep, "object": "file", "bytes": len(JSONL), "created_at": 1,
                       "filename": "kept.jsonl", "purpose": "fine-tune"}, fh)
        gone = ["file-" + "b" * 24 + ".jsonl.tmp-Ab12Cd", "file-" + "b" * 24 + ".json.tmp-zz09zz",
                "file-" + "c" * 24 + ".jsonl"]
        kept = [keep + ".json", keep + ".jsonl", "file-" + "d" * 24 + ".jsonl",  # too young to judge
                "notes.tmp-abcdef", "file-xyz.jsonl.tmp-abcdef", "file-" + "e" * 24 + ".jsonl.tmp-ab"]
        for name in gone + kept[2:]:
            with open(os.path.join(fdir, name), "wb") as fh:
                fh.write(b"{}\n")
        old = time.time() - 7200
        os.utime(os.path.join(fdir, gone[2]), (old, old))
        srv = Server(model, d)
        try:
            srv.wait_ready()
            left = sorted(os.listdir(fdir))
            c.check(left == sorted(kept), f"stale uploads removed, the rest kept: {left}")
            r = srv.get("/v1/files")
            c.check(r.status_code == 200 and [x["id"] for x in r.json()["data"]] == [keep]
                    and r.json()["data"][0]["filename"] == "kept.jsonl", f"listed: {r.text[:300]}")
        finally:
            c.check(srv.stop() == 0, "the server stops cleanly")
    srv = Server(model)
    try:
        srv.wait_ready()
        r = srv.get("/v1/files")
        c.check(r.status_code == 403 and r.json()["error"]["code"] == "files_disabled"
                and "--train-dir" in r.json()["error"]["message"], f"no train dir: {r.text[:200]}")
        r = srv.requests.post(srv.base + "/v1/files", data=b"--x\r\n", timeout=30,
                              headers={"Content-Type": "multipart/form-data; boundary=x"})
        c.check(r.status_code == 403, f"no uploads without a train dir: {r.status_code} {r.text[:200]}")
    finally:
        c.check(srv.stop() == 0, "the server stops cleanly")
    return c.summary()


def main():
    model = server_prerequisites()
    if not model:
        return SKIP
    rc = run_restart(model)
    state = {}
    return rc | run_session("lathe_files_", 300,
                       lambda c, srv, client, train_dir: (
                           ("upload", lambda: run_upload(c, srv, client, train_dir, state)),
                           ("bad uploads", lambda: run_bad_uploads(c, srv, client, train_dir, state)),
                           ("fine-tune", lambda: run_fine_tune(c, srv, client, train_dir, state)),
                           ("delete", lambda: run_delete(c, srv, client, train_dir, state))),
                       extra=("--max-upload-mib", "1"))


if __name__ == "__main__":
    sys.exit(main())
