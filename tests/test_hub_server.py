"""The real huggingface_hub / datasets / transformers clients against tests/hub_server.py."""

import hashlib
import http.client
import ipaddress
import socket
import sys
import tempfile
from pathlib import Path

import pytest

try:
    from .hub_fixtures import configure_hf_env, endpoint_port
    from .hub_server import HubServer, git_blob_sha1
except ImportError:  # tests/ is not a package: it is on sys.path itself
    from hub_fixtures import configure_hf_env, endpoint_port
    from hub_server import HubServer, git_blob_sha1

# The HF libraries read these variables at import time: set them before importing any.
if endpoint_port() is None:
    if "huggingface_hub" in sys.modules:
        pytest.skip("huggingface_hub was imported before configure_hf_env ran", allow_module_level=True)
    configure_hf_env(Path(tempfile.mkdtemp(prefix="hf_hub_test_")))

import huggingface_hub  # noqa: E402
from huggingface_hub import HfApi, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

NOTES_V1 = b"first version of the notes\n"
NOTES_V2 = b"second version of the notes\n"
BLOB = bytes(range(256)) * 80  # 20 480 bytes, binary: goes through LFS

_outside_connections: list = []
_real_connect = socket.socket.connect


def _loopback_only_connect(self, address):
    """socket.connect that refuses (and records) any non-loopback destination."""
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            _outside_connections.append(address)
            raise OSError(f"test guard: connection to non-loopback address {address} refused")
    return _real_connect(self, address)


@pytest.fixture(scope="module", autouse=True)
def loopback_only():
    socket.socket.connect = _loopback_only_connect
    yield
    socket.socket.connect = _real_connect


@pytest.fixture(scope="module")
def hub(request, tmp_path_factory):
    """The conftest's session `hub_server` when there is one, else a server of our own."""
    try:
        yield request.getfixturevalue("hub_server")
        return
    except pytest.FixtureLookupError:
        pass
    server = HubServer(tmp_path_factory.mktemp("hub_storage"), port=endpoint_port()).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api(hub):
    assert huggingface_hub.constants.ENDPOINT == hub.url
    return HfApi()


@pytest.fixture(scope="module")
def files_repo(api, tmp_path_factory):
    """user/hubtest-files with notes.txt (regular) and weights/blob.bin (LFS); returns the first commit id."""
    folder = tmp_path_factory.mktemp("upload")
    (folder / "notes.txt").write_bytes(NOTES_V1)
    (folder / "weights").mkdir()
    (folder / "weights" / "blob.bin").write_bytes(BLOB)
    api.create_repo("user/hubtest-files")
    info = api.upload_folder(folder_path=folder, repo_id="user/hubtest-files", commit_message="add files")
    return "user/hubtest-files", info.oid, folder


def _request(hub, method, path, headers=None):
    """A raw request that does not follow redirects."""
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    conn.request(method, path, headers=headers or {})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def test_create_repo_exist_ok_and_conflict(api, hub):
    url = api.create_repo("user/hubtest-created")
    assert url == f"{hub.url}/user/hubtest-created"
    assert url.repo_id == "user/hubtest-created"
    assert api.create_repo("user/hubtest-created", exist_ok=True) == url
    with pytest.raises(HfHubHTTPError) as excinfo:
        api.create_repo("user/hubtest-created")
    assert excinfo.value.response.status_code == 409
    dataset_url = api.create_repo("user/hubtest-created", repo_type="dataset")
    assert dataset_url == f"{hub.url}/datasets/user/hubtest-created"
    assert api.repo_info("user/hubtest-created", repo_type="dataset").id == "user/hubtest-created"


def test_upload_and_download(api, files_repo):
    repo_id, first_commit, folder = files_repo
    assert len(first_commit) == 40 and int(first_commit, 16) >= 0
    assert api.list_repo_files(repo_id) == [".gitattributes", "notes.txt", "weights/blob.bin"]
    assert Path(hf_hub_download(repo_id, "notes.txt", revision=first_commit)).read_bytes() == NOTES_V1
    assert Path(hf_hub_download(repo_id, "weights/blob.bin")).read_bytes() == BLOB

    entries = {entry.path: entry for entry in api.list_repo_tree(repo_id, recursive=True)}
    assert set(entries) == {".gitattributes", "notes.txt", "weights", "weights/blob.bin"}
    assert entries["notes.txt"].lfs is None
    assert entries["notes.txt"].blob_id == git_blob_sha1(NOTES_V1)
    assert entries["weights/blob.bin"].lfs.sha256 == hashlib.sha256(BLOB).hexdigest()
    assert entries["weights/blob.bin"].size == len(BLOB)
    [folder_entry] = api.list_repo_tree(repo_id, path_in_repo="weights")
    assert folder_entry.path == "weights/blob.bin"


def test_identical_files_are_not_uploaded_again(api, hub, files_repo):
    repo_id, first_commit, folder = files_repo
    seen = len(hub.requests)
    api.upload_folder(folder_path=folder, repo_id=repo_id)
    new_requests = hub.requests[seen:]
    assert not [r for r in new_requests if r[0] == "PUT"]
    assert not [r for r in new_requests if "/commit/" in r[2]]
    assert api.repo_info(repo_id).sha == first_commit


def test_old_revision_stays_readable(api, files_repo):
    repo_id, first_commit, _ = files_repo
    info = api.upload_file(path_or_fileobj=NOTES_V2, path_in_repo="notes.txt", repo_id=repo_id,
                           commit_message="update notes", parent_commit=first_commit)
    assert info.oid != first_commit
    assert api.repo_info(repo_id).sha == info.oid
    assert api.repo_info(repo_id, revision=first_commit).sha == first_commit
    assert Path(hf_hub_download(repo_id, "notes.txt")).read_bytes() == NOTES_V2
    assert Path(hf_hub_download(repo_id, "notes.txt", revision=first_commit)).read_bytes() == NOTES_V1
    commits = api.list_repo_commits(repo_id)
    assert [c.commit_id for c in commits[:2]] == [info.oid, first_commit]
    assert commits[0].title == "update notes"
    refs = api.list_repo_refs(repo_id)
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", info.oid)]
    with pytest.raises(HfHubHTTPError) as excinfo:  # parent_commit is no longer the head
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=repo_id, parent_commit=first_commit)
    assert excinfo.value.response.status_code == 412


def test_missing_repo_revision_and_file(api, files_repo):
    repo_id, _, _ = files_repo
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("user/hubtest-missing")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("user/hubtest-missing", "config.json")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(repo_id, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repo_id, "notes.txt", revision="no-such-branch")
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(repo_id, "missing.txt")
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree(repo_id, path_in_repo="no-such-dir"))
    assert not api.file_exists(repo_id, "missing.txt")
    assert api.file_exists(repo_id, "weights/blob.bin")


def test_delete_and_pull_request(api):
    repo_id = "user/hubtest-ops"
    api.create_repo(repo_id)
    api.upload_file(path_or_fileobj=b"a", path_in_repo="dir/a.txt", repo_id=repo_id)
    api.upload_file(path_or_fileobj=b"b", path_in_repo="dir/b.txt", repo_id=repo_id)
    main = api.repo_info(repo_id).sha
    pr = api.upload_file(path_or_fileobj=b"c", path_in_repo="c.txt", repo_id=repo_id, create_pr=True)
    assert pr.pr_url is not None and pr.pr_revision == "refs/pr/1"
    assert api.repo_info(repo_id).sha == main
    assert Path(hf_hub_download(repo_id, "c.txt", revision="refs/pr/1")).read_bytes() == b"c"
    info = {entry.path: entry for entry in api.get_paths_info(repo_id, ["dir", "dir/a.txt", "nope"])}
    assert sorted(info) == ["dir", "dir/a.txt"] and info["dir/a.txt"].blob_id == git_blob_sha1(b"a")
    api.delete_file("dir/a.txt", repo_id)
    assert api.list_repo_files(repo_id) == [".gitattributes", "dir/b.txt"]
    with pytest.raises(EntryNotFoundError):
        api.delete_file("dir/a.txt", repo_id)
    api.delete_folder("dir", repo_id)
    assert api.list_repo_files(repo_id) == [".gitattributes"]


def test_snapshot_download(files_repo):
    repo_id, first_commit, _ = files_repo
    snapshot = Path(snapshot_download(repo_id, revision=first_commit))
    assert snapshot.name == first_commit
    assert (snapshot / "notes.txt").read_bytes() == NOTES_V1
    assert (snapshot / "weights" / "blob.bin").read_bytes() == BLOB


def test_resolve_headers_redirect_and_range(hub, files_repo):
    repo_id, first_commit, _ = files_repo
    response, _ = _request(hub, "HEAD", f"/{repo_id}/resolve/{first_commit}/notes.txt")
    assert response.status == 200
    assert response.getheader("ETag") == f'"{git_blob_sha1(NOTES_V1)}"'
    assert response.getheader("X-Repo-Commit") == first_commit
    assert response.getheader("Content-Length") == str(len(NOTES_V1))

    response, body = _request(hub, "GET", f"/{repo_id}/resolve/main/notes.txt", {"Range": "bytes=7-13"})
    assert (response.status, body) == (206, NOTES_V2[7:14])
    assert response.getheader("Content-Range") == f"bytes 7-13/{len(NOTES_V2)}"
    response, _ = _request(hub, "GET", f"/{repo_id}/resolve/main/notes.txt", {"Range": "bytes=999-"})
    assert response.status == 416

    response, _ = _request(hub, "HEAD", f"/{repo_id}/resolve/main/weights/blob.bin")
    assert response.status == 302
    assert response.getheader("X-Linked-Etag") == f'"{hashlib.sha256(BLOB).hexdigest()}"'
    assert response.getheader("X-Linked-Size") == str(len(BLOB))
    location = response.getheader("Location")
    assert location.startswith(f"http://localhost:{hub.port}/")
    response, body = _request(hub, "GET", location.split(str(hub.port), 1)[1], {"Range": "bytes=-10"})
    assert (response.status, body) == (206, BLOB[-10:])

    response, _ = _request(hub, "HEAD", f"/{repo_id}/resolve/main/nope.txt")
    assert (response.status, response.getheader("X-Error-Code")) == (404, "EntryNotFound")
    response, _ = _request(hub, "GET", "/api/models/user/hubtest-nope")
    assert (response.status, response.getheader("X-Error-Code")) == (404, "RepoNotFound")


def test_datasets_push_and_load(hub):
    import datasets

    datasets.config.USE_PARQUET_EXPORT = False
    rows = {"text": ["a", "bb", "ccc"], "label": [0, 1, 0]}
    datasets.Dataset.from_dict(rows).push_to_hub("user/hubtest-ds")
    files = HfApi().list_repo_files("user/hubtest-ds", repo_type="dataset")
    assert any(path.startswith("data/") and path.endswith(".parquet") for path in files)
    loaded = datasets.load_dataset("user/hubtest-ds")
    assert list(loaded) == ["train"]
    assert loaded["train"].to_dict() == rows


def test_transformers_push_and_from_pretrained(hub):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=50, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    model.push_to_hub("user/hubtest-tiny")
    assert "model.safetensors" in HfApi().list_repo_files("user/hubtest-tiny")
    loaded = transformers.GPT2LMHeadModel.from_pretrained("user/hubtest-tiny")
    assert loaded.config.n_embd == 8 and loaded.config.vocab_size == 50
    expected, actual = model.state_dict(), loaded.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


def test_no_request_left_loopback(hub):
    """Runs last: nothing tried to reach a non-loopback address, the server saw only loopback hosts."""
    assert _outside_connections == []
    hosts = {host.rsplit(":", 1)[0] for _, host, _ in hub.requests}
    assert hosts <= {"127.0.0.1", "localhost"}
    assert "localhost" in hosts  # LFS downloads followed the redirect to the other host name
