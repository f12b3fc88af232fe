"""Publishing a finished output folder to the Hugging Face Hub (or any Hub-compatible endpoint)."""

import logging

from huggingface_hub import HfApi, constants
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

logger = logging.getLogger(__name__)

# Training leftovers that do not belong in a published model repo.
IGNORE_PATTERNS = ["checkpoint-*", "checkpoint-*/**", "*.tmp", "runs/**", "training_args.bin", "trainer_state.json",
                   "train_results.json", "eval_results.json", "test_results.json", "averaging_results.json",
                   "run_finished.json"]


def check_repo_id(repo_id: str | None) -> str:
    """Validate a Hub repo id ("user/name") before any work is done.

    Raises:
        ValueError: when it is missing or malformed.
    """
    if not repo_id:
        raise ValueError("--push_to_hub needs --hub_model_id, e.g. 'your-name/scratch-transformer-de-en'")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"malformed hub_model_id {repo_id!r}: {error}") from error
    if repo_id.count("/") != 1:
        raise ValueError(f"hub_model_id must look like 'user/name', got {repo_id!r}")
    return repo_id


def check_hub_access(repo_id: str) -> str:
    """Before any work: the Hub answers and takes this token for writing (one whoami request, no retries).

    Returns:
        the user name the token belongs to.
    Raises:
        ValueError: naming --push_to_hub and the endpoint: no token, a token the Hub refuses or that can only
            read, or a Hub that cannot be reached.
    """
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    where = f"--push_to_hub {repo_id}"
    try:
        info = HfApi().whoami()
    except LocalTokenNotFoundError:
        raise ValueError(f"{where}: no Hugging Face token to push with (log in: hf auth login, or set HF_TOKEN); "
                         f"checked before training") from None
    except HfHubHTTPError as error:
        status = getattr(error.response, "status_code", None)
        if status in (401, 403):
            raise ValueError(f"{where}: the Hub ({constants.ENDPOINT}) refuses the token (HTTP {status}); log in "
                             "again: hf auth login") from None
        raise ValueError(f"{where}: the Hub ({constants.ENDPOINT}) answered HTTP {status} to a token check: "
                         f"{str(error).splitlines()[0]}") from None
    except Exception as error:  # connection refused, DNS, timeout
        raise ValueError(f"{where}: the Hub ({constants.ENDPOINT}) cannot be reached ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}); check the connection, or leave "
                         "--push_to_hub out and push the folder later") from None
    role = ((info.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise ValueError(f"{where}: the token can only read (role 'read'); use a token with write access")
    return info.get("name", "")


def push_output_dir(folder: str, repo_id: str, private: bool | None = None, commit_message: str | None = None) -> str:
    """Create the model repo if needed and upload the folder (weights, config, code, tokenizer, card, curve).

    Returns:
        the commit id of the upload.
    Raises:
        ValueError: malformed repo id; RuntimeError: the Hub could not be reached or refused the upload
        (the local folder is left as it was).
    """
    check_repo_id(repo_id)
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, folder_path=folder, ignore_patterns=IGNORE_PATTERNS,
                                   commit_message=commit_message or "Upload scratch_transformer model")
    except Exception as error:  # connection refused, HTTP errors: say where and why, keep the folder
        raise RuntimeError(f"could not push {folder} to {constants.ENDPOINT}/{repo_id}: {error}") from error
    logger.info("pushed %s to %s at commit %s", folder, repo_id, commit.oid)
    return commit.oid
