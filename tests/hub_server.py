"""A small Hugging Face Hub-compatible HTTP server for the test suite.

It speaks the subset of the Hub protocol that huggingface_hub, transformers and
datasets use (see docs/hub-protocol.md): repo creation, preupload, git-lfs batch
uploads, NDJSON commits, repo info, tree listing, paths-info and file resolution.
Everything is stored under one folder: file contents as blobs named by their
sha256, and one JSON file per repo holding its branches and commits.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, unquote

import uvicorn
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

USER = "user"
LFS_THRESHOLD = 10_000  # bytes; bigger files go through LFS
LFS_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".npy", ".npz",
    ".png", ".jpg", ".jpeg", ".gif", ".wav", ".mp3", ".parquet", ".arrow", ".zip", ".gz", ".tar",
)
TYPE_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
GITATTRIBUTES = "".join(
    f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n" for suffix in LFS_SUFFIXES
).encode()

REPO = r"(?P<repo>[^/]+(?:/[^/]+)?)"
API = r"/api/(?P<t>model|dataset|space)s/" + REPO


def git_blob_sha1(data: bytes) -> str:
    """Git object id of a blob."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(oid: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n".encode()


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class HubError(Exception):
    """An error answered as JSON, with the Hub's X-Error-Code header when given."""

    def __init__(self, status: int, message: str, code: str | None = None, body: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.body = status, message, code, body

    def response(self) -> Response:
        headers = {"X-Error-Message": self.message}
        if self.code:
            headers["X-Error-Code"] = self.code
        return JSONResponse({"error": self.message, **(self.body or {})}, self.status, headers=headers)


class HubStore:
    """Repos, commits and blobs on disk. All methods are thread-safe."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()

    # -- blobs (keyed by sha256 of the content) --
    def put_object(self, data: bytes) -> str:
        oid = hashlib.sha256(data).hexdigest()
        path = self.objects / oid
        if not path.exists():
            tmp = path.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_bytes(data)
            tmp.replace(path)
        return oid

    def has_object(self, oid: str) -> bool:
        return bool(re.fullmatch(r"[0-9a-f]{64}", oid)) and (self.objects / oid).is_file()

    def read_object(self, oid: str) -> bytes:
        return (self.objects / oid).read_bytes()

    # -- repos --
    def _meta_path(self, repo_type: str, repo_id: str) -> Path:
        return self.root / "repos" / repo_type / repo_id / "meta.json"

    def load(self, repo_type: str, repo_id: str) -> dict:
        path = self._meta_path(repo_type, repo_id)
        if not path.is_file():
            raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return json.loads(path.read_text())

    def save(self, meta: dict) -> None:
        path = self._meta_path(meta["type"], meta["id"])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta))
        tmp.replace(path)

    def exists(self, repo_type: str, repo_id: str) -> bool:
        return self._meta_path(repo_type, repo_id).is_file()

    def create(self, repo_type: str, repo_id: str, private: bool) -> bool:
        """Create a repo with an initial commit holding .gitattributes; False if it exists."""
        with self.lock:
            if self.exists(repo_type, repo_id):
                return False
            meta = {"type": repo_type, "id": repo_id, "private": private, "createdAt": now_iso(),
                    "refs": {}, "commits": {}}
            self._add_commit(meta, "main", None, {".gitattributes": self._entry(GITATTRIBUTES, False)},
                             "initial commit", "")
            self.save(meta)
            return True

    def delete(self, repo_type: str, repo_id: str) -> None:
        with self.lock:
            path = self._meta_path(repo_type, repo_id)
            if not path.is_file():
                raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
            path.unlink()

    # -- revisions and trees --
    @staticmethod
    def resolve(meta: dict, rev: str) -> str:
        """Branch name or commit id -> commit id."""
        if rev in meta["refs"]:
            return meta["refs"][rev]
        if rev in meta["commits"]:
            return rev
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def _entry(self, data: bytes, lfs: bool) -> dict:
        oid = self.put_object(data)
        return self._lfs_entry(oid, len(data)) if lfs else {"sha256": oid, "size": len(data), "lfs": False,
                                                             "oid": git_blob_sha1(data)}

    @staticmethod
    def _lfs_entry(oid: str, size: int) -> dict:
        pointer = lfs_pointer(oid, size)
        return {"sha256": oid, "size": size, "lfs": True, "oid": git_blob_sha1(pointer),
                "pointerSize": len(pointer)}

    @staticmethod
    def _add_commit(meta: dict, branch: str, parent: str | None, tree: dict, title: str, message: str) -> str:
        date = now_iso()
        record = {"parents": [parent] if parent else [], "tree": tree, "title": title, "message": message,
                  "date": date}
        cid = hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()
        meta["commits"][cid] = record
        meta["refs"][branch] = cid
        meta["lastModified"] = date
        return cid

    def commit(self, repo_type: str, repo_id: str, rev: str, lines: list[dict], create_pr: bool) -> tuple[str, str]:
        """Apply NDJSON commit operations; returns (commit id, branch)."""
        with self.lock:
            meta = self.load(repo_type, repo_id)
            head = self.resolve(meta, rev)
            branch = rev
            if create_pr:
                number = 1 + sum(ref.startswith("refs/pr/") for ref in meta["refs"])
                branch = f"refs/pr/{number}"
            elif rev not in meta["refs"]:
                raise HubError(400, f"Invalid rev id: {rev} is not a branch", "RevisionNotFound")
            tree = dict(meta["commits"][head]["tree"])
            header: dict = {}
            for line in lines:
                key, value = line.get("key"), line.get("value", {})
                if key == "header":
                    header = value
                    parent = value.get("parentCommit")
                    if parent and parent != head:
                        raise HubError(412, f"parentCommit {parent} is not the head of {rev} ({head})")
                elif key == "file":
                    raw = value["content"]
                    data = base64.b64decode(raw) if value.get("encoding") == "base64" else raw.encode()
                    tree[value["path"]] = self._entry(data, False)
                elif key == "lfsFile":
                    oid = value["oid"]
                    if not self.has_object(oid):
                        raise HubError(400, f"LFS object {oid} for {value['path']} was never uploaded")
                    tree[value["path"]] = self._lfs_entry(oid, (self.objects / oid).stat().st_size)
                elif key == "deletedFile":
                    if tree.pop(value["path"], None) is None:
                        raise HubError(404, f"File {value['path']} not found", "EntryNotFound")
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    doomed = [path for path in tree if path.startswith(prefix)]
                    if not doomed:
                        raise HubError(404, f"Folder {value['path']} not found", "EntryNotFound")
                    for path in doomed:
                        del tree[path]
                else:
                    raise HubError(400, f"Unknown commit operation {key!r}")
            cid = self._add_commit(meta, branch, head, tree, header.get("summary", ""),
                                   header.get("description", ""))
            self.save(meta)
            return cid, branch

    @staticmethod
    def history(meta: dict, cid: str):
        """Commit ids from cid back to the first commit (first parents only)."""
        while cid:
            yield cid
            parents = meta["commits"][cid]["parents"]
            cid = parents[0] if parents else None

    @staticmethod
    def folder_oid(tree: dict, folder: str) -> str | None:
        prefix = folder + "/"
        inner = sorted((path, entry["oid"]) for path, entry in tree.items() if path.startswith(prefix))
        return hashlib.sha1(json.dumps(inner).encode()).hexdigest() if inner else None

    def last_commit(self, meta: dict, cid: str, path: str, is_dir: bool) -> dict:
        """The oldest commit since which `path` is unchanged, as the Hub's lastCommit."""
        def state(commit_id):
            tree = meta["commits"][commit_id]["tree"]
            return self.folder_oid(tree, path) if is_dir else (tree.get(path) or {}).get("oid")

        current, found = state(cid), cid
        for commit_id in self.history(meta, cid):
            if state(commit_id) != current:
                break
            found = commit_id
        record = meta["commits"][found]
        return {"id": found, "title": record["title"], "date": record["date"]}


def file_info(store: HubStore, meta: dict, cid: str, path: str, entry: dict, expand: bool) -> dict:
    """Tree / paths-info entry for a file."""
    info = {"type": "file", "path": path, "size": entry["size"], "oid": entry["oid"]}
    if entry["lfs"]:
        info["lfs"] = {"oid": entry["sha256"], "size": entry["size"], "pointerSize": entry["pointerSize"]}
    if expand:
        info["lastCommit"] = store.last_commit(meta, cid, path, False)
    return info


def folder_info(store: HubStore, meta: dict, cid: str, path: str, expand: bool) -> dict:
    info = {"type": "directory", "path": path, "oid": store.folder_oid(meta["commits"][cid]["tree"], path)}
    if expand:
        info["lastCommit"] = store.last_commit(meta, cid, path, True)
    return info


def is_lfs_candidate(path: str, size: int, sample: bytes) -> bool:
    return size > LFS_THRESHOLD or path.lower().endswith(LFS_SUFFIXES) or b"\0" in sample


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """'bytes=a-b' -> (start, end inclusive); None when absent or unparsable."""
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if not match or match.group(1) == match.group(2) == "":
        return None
    first, last = match.groups()
    if first == "":
        return max(size - int(last), 0), size - 1
    return int(first), min(int(last), size - 1) if last else size - 1


def send_bytes(request: Request, data: bytes, headers: dict) -> Response:
    """Answer GET (with Range) or HEAD for a blob."""
    size = len(data)
    headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
    byte_range = parse_range(request.headers.get("range"), size)
    status = 200
    if byte_range is not None:
        start, end = byte_range
        if start >= size:
            return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
        data, status = data[start:end + 1], 206
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    if request.method == "HEAD":
        return Response(status_code=status, headers={**headers, "Content-Length": str(len(data))})
    return Response(data, status_code=status, headers=headers)


def create_app(store: HubStore) -> FastAPI:
    """Build the FastAPI app. `app.state.requests` records (method, host, path) of every request."""
    app = FastAPI(title="local-hub", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.requests = []
    routes: list[tuple[set[str], re.Pattern, object]] = []

    def route(methods: str, pattern: str):
        def register(func):
            routes.append((set(methods.split()), re.compile(pattern), func))
            return func
        return register

    def base(request: Request) -> str:
        return f"http://{request.headers.get('host', request.url.netloc)}"

    def repo_url(request: Request, repo_type: str, repo_id: str) -> str:
        return f"{base(request)}/{TYPE_PREFIX[repo_type]}{repo_id}"

    def load_rev(t: str, repo: str, rev: str) -> tuple[dict, str]:
        meta = store.load(t, repo)
        return meta, store.resolve(meta, rev)

    @app.api_route("/{full:path}", methods=["GET", "HEAD", "POST", "PUT", "DELETE"])
    async def dispatch(request: Request, full: str):
        raw_path = request.scope.get("raw_path", b"").decode() or request.url.path
        raw_path = raw_path.split("?", 1)[0]
        app.state.requests.append((request.method, request.headers.get("host", ""), raw_path))
        for methods, pattern, func in routes:
            match = pattern.fullmatch(raw_path)
            if match and request.method in methods:
                params = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                try:
                    return await func(request, **params)
                except HubError as err:
                    return err.response()
        return HubError(404, f"No route for {request.method} {raw_path}").response()

    @route("GET", r"/api/whoami-v2")
    async def whoami(request):
        return {"type": "user", "id": "0" * 24, "name": USER, "fullname": "Test User", "email": "user@example.com",
                "emailVerified": True, "isPro": False, "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": "write",
                                                                 "createdAt": "2024-01-01T00:00:00.000Z"}}}

    @route("POST", r"/api/repos/create")
    async def create_repo(request):
        body = await request.json()
        repo_type = body.get("type") or "model"
        repo_id = f"{body.get('organization') or USER}/{body['name']}"
        private = bool(body.get("private")) or body.get("visibility") == "private"
        url = repo_url(request, repo_type, repo_id)
        if not store.create(repo_type, repo_id, private):
            raise HubError(409, f"You already created this {repo_type} repo", body={"url": url})
        return {"url": url, "name": repo_id, "id": repo_id}

    @route("DELETE", r"/api/repos/delete")
    async def delete_repo(request):
        body = await request.json()
        store.delete(body.get("type") or "model", f"{body.get('organization') or USER}/{body['name']}")
        return {}

    @route("POST", r"/api/validate-yaml")
    async def validate_yaml(request):
        return {"errors": [], "warnings": []}

    @route("GET", API + r"(?:/revision/(?P<rev>[^/]+))?")
    async def repo_info(request, t, repo, rev="main"):
        meta, cid = load_rev(t, repo, rev)
        tree = meta["commits"][cid]["tree"]
        blobs = request.query_params.get("blobs", "").lower() in ("1", "true")
        siblings = []
        for path in sorted(tree):
            sibling = {"rfilename": path}
            if blobs:
                entry = tree[path]
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if entry["lfs"]:
                    sibling["lfs"] = {"size": entry["size"], "sha256": entry["sha256"],
                                      "pointerSize": entry["pointerSize"]}
            siblings.append(sibling)
        info = {"_id": hashlib.sha1(f"{t}/{repo}".encode()).hexdigest()[:24], "id": repo,
                "author": repo.split("/")[0], "sha": cid, "lastModified": meta["commits"][cid]["date"],
                "createdAt": meta["createdAt"], "private": meta["private"], "gated": False, "disabled": False,
                "downloads": 0, "likes": 0, "tags": [], "siblings": siblings}
        if "README.md" in tree:
            card = store.read_object(tree["README.md"]["sha256"]).decode("utf-8", "replace")
            front = re.match(r"---\n(.*?)\n---", card, re.S)
            card_data = yaml.safe_load(front.group(1)) if front else None
            if isinstance(card_data, dict):
                info["cardData"] = card_data
        if t == "space":
            info.update(sdk="static", runtime={"stage": "RUNNING", "hardware": {"current": None}})
        return info

    @route("GET", API + r"/refs")
    async def refs(request, t, repo):
        meta = store.load(t, repo)
        branches = [{"name": name, "ref": f"refs/heads/{name}", "targetCommit": cid}
                    for name, cid in meta["refs"].items() if not name.startswith("refs/")]
        prs = [{"name": name.rsplit("/", 1)[1], "ref": name, "targetCommit": cid}
               for name, cid in meta["refs"].items() if name.startswith("refs/pr/")]
        return {"branches": branches, "converts": [], "tags": [], "pullRequests": prs}

    @route("POST", API + r"/branch/(?P<branch>[^/]+)")
    async def create_branch(request, t, repo, branch):
        body = await request.json() if await request.body() else {}
        with store.lock:
            meta = store.load(t, repo)
            if branch in meta["refs"]:
                raise HubError(409, f"Branch {branch} already exists")
            meta["refs"][branch] = store.resolve(meta, body.get("startingPoint") or "main")
            store.save(meta)
        return {}

    @route("GET", API + r"/commits/(?P<rev>[^/]+)")
    async def commits(request, t, repo, rev):
        meta, cid = load_rev(t, repo, rev)
        return [{"id": commit_id, "title": meta["commits"][commit_id]["title"],
                 "message": meta["commits"][commit_id]["message"], "date": meta["commits"][commit_id]["date"],
                 "authors": [{"user": USER}]} for commit_id in store.history(meta, cid)]

    @route("GET", API + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?")
    async def tree(request, t, repo, rev, path=""):
        meta, cid = load_rev(t, repo, rev)
        files = meta["commits"][cid]["tree"]
        recursive = request.query_params.get("recursive", "").lower() in ("1", "true")
        expand = request.query_params.get("expand", "").lower() in ("1", "true")
        folder = path.strip("/")
        prefix = folder + "/" if folder else ""
        if folder and not any(p.startswith(prefix) for p in files):
            raise HubError(404, f"Path {folder} not found in {rev}", "EntryNotFound")
        entries, folders = [], set()
        for file_path in sorted(files):
            if not file_path.startswith(prefix):
                continue
            parts = file_path[len(prefix):].split("/")
            for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
                folders.add(prefix + "/".join(parts[:depth]))
            if recursive or len(parts) == 1:
                entries.append(file_info(store, meta, cid, file_path, files[file_path], expand))
        entries += [folder_info(store, meta, cid, name, expand) for name in sorted(folders)]
        return entries

    @route("POST", API + r"/paths-info/(?P<rev>[^/]+)")
    async def paths_info(request, t, repo, rev):
        meta, cid = load_rev(t, repo, rev)
        files = meta["commits"][cid]["tree"]
        if request.headers.get("content-type", "").startswith("application/json"):
            form = await request.json()
            paths, expand = form.get("paths", []), bool(form.get("expand"))
        else:
            form = parse_qs((await request.body()).decode())
            paths, expand = form.get("paths", []), form.get("expand", ["False"])[0].lower() == "true"
        out = []
        for path in paths:
            path = path.strip("/")
            if path in files:
                out.append(file_info(store, meta, cid, path, files[path], expand))
            elif any(p.startswith(path + "/") for p in files):
                out.append(folder_info(store, meta, cid, path, expand))
        return out

    @route("POST", API + r"/preupload/(?P<rev>[^/]+)")
    async def preupload(request, t, repo, rev):
        meta, cid = load_rev(t, repo, rev)
        files = meta["commits"][cid]["tree"]
        answer = []
        for item in (await request.json()).get("files", []):
            path, size = item["path"], int(item.get("size", 0))
            existing = files.get(path)
            lfs = (existing or {}).get("lfs") or is_lfs_candidate(path, size, base64.b64decode(item.get("sample", "")))
            oid = None
            if existing:
                oid = existing["sha256"] if lfs and existing["lfs"] else (None if lfs else existing["oid"])
            answer.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                           "oid": oid})
        return {"files": answer, "commitOid": cid}

    @route("POST", API + r"/commit/(?P<rev>[^/]+)")
    async def commit(request, t, repo, rev):
        body = (await request.body()).decode()
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        create_pr = request.query_params.get("create_pr", "") in ("1", "true", "True")
        cid, branch = store.commit(t, repo, rev, lines, create_pr)
        url = repo_url(request, t, repo)
        pr_url = f"{url}/discussions/{branch.rsplit('/', 1)[1]}" if create_pr else None
        return {"success": True, "commitOid": cid, "commitUrl": f"{url}/commit/{cid}", "pullRequestUrl": pr_url,
                "commitMessage": next((line["value"].get("summary") for line in lines if line["key"] == "header"), "")}

    @route("POST", r"/(?:(?P<p>datasets|spaces)/)?" + REPO + r"\.git/info/lfs/objects/batch")
    async def lfs_batch(request, repo, p="models"):
        store.load(p[:-1], repo)  # "datasets" -> "dataset"
        body = await request.json()
        if body.get("operation", "upload") != "upload":
            raise HubError(400, "Only the upload operation is supported")
        objects = []
        for obj in body.get("objects", []):
            oid, size = obj["oid"], int(obj["size"])
            answer = {"oid": oid, "size": size, "authenticated": True}
            if not store.has_object(oid):
                answer["actions"] = {
                    "upload": {"href": f"{base(request)}/_lfs/upload/{oid}", "header": {}},
                    "verify": {"href": f"{base(request)}/_lfs/verify/{oid}", "header": {}},
                }
            objects.append(answer)
        return JSONResponse({"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                            media_type="application/vnd.git-lfs+json")

    @route("PUT", r"/_lfs/upload/(?P<oid>[0-9a-f]{64})")
    async def lfs_put(request, oid):
        data = await request.body()
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, "Uploaded content does not match its sha256")
        store.put_object(data)
        return Response(status_code=200)

    @route("POST", r"/_lfs/verify/(?P<oid>[0-9a-f]{64})")
    async def lfs_verify(request, oid):
        body = await request.json()
        if not store.has_object(oid) or (store.objects / oid).stat().st_size != int(body.get("size", -1)):
            raise HubError(404, f"LFS object {oid} not found")
        return {}

    @route("GET HEAD", r"/_lfs/objects/(?P<oid>[0-9a-f]{64})")
    async def lfs_download(request, oid):
        if not store.has_object(oid):
            raise HubError(404, "Object not found", "EntryNotFound")
        return send_bytes(request, store.read_object(oid), {"ETag": f'"{oid}"'})

    @route("GET HEAD", r"/(?:(?P<p>datasets|spaces)/)?" + REPO + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)")
    async def resolve(request, repo, rev, path, p="models"):
        meta, cid = load_rev(p[:-1], repo, rev)
        entry = meta["commits"][cid]["tree"].get(path)
        if entry is None:
            raise HubError(404, f"Entry {path} not found", "EntryNotFound")
        headers = {"X-Repo-Commit": cid, "ETag": f'"{entry["oid"]}"'}
        if entry["lfs"]:
            host = request.headers.get("host", "")
            other = host.replace("127.0.0.1", "localhost") if "127.0.0.1" in host else host.replace(
                "localhost", "127.0.0.1")
            return Response(status_code=302, headers={
                **headers, "Location": f"http://{other}/_lfs/objects/{entry['sha256']}",
                "X-Linked-Etag": f'"{entry["sha256"]}"', "X-Linked-Size": str(entry["size"]),
                "Content-Length": "0"})
        return send_bytes(request, store.read_object(entry["sha256"]), headers)

    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HubServer:
    """Runs the app with uvicorn in a background thread on 127.0.0.1."""

    def __init__(self, root: Path, port: int | None = None):
        self.root = Path(root)
        self.port = port or free_port()
        self.store = HubStore(self.root)
        self.app = create_app(self.store)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[tuple[str, str, str]]:
        """(method, Host header, raw path) of every request seen so far."""
        return self.app.state.requests

    def start(self, timeout: float = 15.0) -> "HubServer":
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off",
                                access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="hub-server", daemon=True)
        self._thread.start()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + timeout
        while True:
            try:
                with opener.open(f"{self.url}/api/whoami-v2", timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                if time.monotonic() > deadline or not self._thread.is_alive():
                    self.stop()
                    raise RuntimeError(f"hub server did not start on {self.url}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
