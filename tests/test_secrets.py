"""A secret never reaches a file or the terminal: a key given in the config (as a key override, in
a config file, pasted where an environment variable's name belongs, or as a URL's password) is
refused in one line that does not repeat it, before anything is written; and every log line and
HTTP error line redacts what looks like one (rag/serving/secrets.py, rag/logs.py)."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rag.config.compose import PROJECT_ROOT
from rag.endpoint import Endpoint
from rag.logs import RedactingFormatter
from rag.serving.secrets import is_env_name, looks_like_secret, redact, redact_url
from rag.run.settings import validate
from rag.types import RagError
from tests.conftest import tiny_overrides, write_jsonl
from tests.scripted_endpoint import ScriptedEndpoint, echo
from tests.test_cli_errors import ENV

KEY = "sk-PLANTEDsecret1234567890abcdef"
PASSWORD = "PLANTEDpassword42"
PLANTED = "PLANTED"  # in every planted value: grepped for in every file and on the terminal


# ---- the redaction itself ---------------------------------------------------------------------

def test_a_urls_credentials_are_redacted_and_the_rest_kept():
    assert redact_url(f"http://bob:{PASSWORD}@127.0.0.1:9/v1?x=a@b") == "http://…redacted@127.0.0.1:9/v1?x=a@b"
    assert redact_url("https://TOKEN123@host/v1") == "https://…redacted@host/v1"
    assert redact_url("mailto:someone@example.org and http://host/a@b") == "mailto:someone@example.org and http://host/a@b"


def test_provider_keys_and_bearer_tokens_are_redacted_in_any_text():
    text = f"failed with {KEY}; header Authorization: Bearer abcdefgh12345678; hf_{'a' * 34} done"
    shown = redact(text)
    assert PLANTED not in shown and "abcdefgh12345678" not in shown and "a" * 34 not in shown
    assert "sk-…redacted" in shown and "Bearer …redacted" in shown and "hf_…redacted" in shown
    assert redact("sentence-transformers/all-MiniLM-L6-v2 on /tmp/hf_cache/task-1") == \
        "sentence-transformers/all-MiniLM-L6-v2 on /tmp/hf_cache/task-1"


@pytest.mark.parametrize("value,name", [
    ("OPENAI_API_KEY", True), ("my_key", True), (KEY, False), ("a1B2c3D4e5F6g7H8i9J0kLmN", False),
    ("OPENAI-KEY", False), ("", False),
])
def test_an_environment_variables_name_is_told_from_a_pasted_key(value, name):
    assert is_env_name(value) is name
    if value.startswith(("sk-", "a1B2")):
        assert looks_like_secret(value)


def test_log_lines_and_their_tracebacks_are_redacted():
    fmt = RedactingFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError(f"cannot reach http://bob:{PASSWORD}@host/v1")
    except ValueError:
        record = logging.LogRecord("ragrig", logging.ERROR, __file__, 1, "key %s failed", (KEY,), sys.exc_info())
    line = fmt.format(record)
    assert PLANTED not in line and "ValueError" in line and "http://…redacted@host/v1" in line


def test_the_http_client_refuses_a_base_url_with_credentials_without_repeating_them():
    with pytest.raises(RagError) as e:
        Endpoint(f"http://bob:{PASSWORD}@127.0.0.1:9/v1", "m", what="embedder")
    assert str(e.value).startswith("embedder.base_url must not hold credentials (got http://…redacted@127.0.0.1:9/v1)")
    with pytest.raises(RagError) as e:
        Endpoint(f"ftp://bob:{PASSWORD}@host/v1", "m")
    assert PLANTED not in str(e.value)
    assert PLANTED not in Endpoint("http://127.0.0.1:9/v1", "m").redact(f"redirected to http://u:{PASSWORD}@evil/x")


# ---- every role's api_key_env, and keys in the config -------------------------------------------

ROLES = {
    "llm": ["llm=openai"],
    "embedder": ["embedder=openai"],
    "reranker": ["reranker=http"],
    "eval.judge": [],
    "contextualizer.llm": ["llm@contextualizer.llm=openai"],
    "compressor.llm": ["compressor=llm", "llm@compressor.llm=openai"],
}


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("role", list(ROLES))
def test_a_key_pasted_into_any_roles_api_key_env_is_refused_redacted(role):
    with pytest.raises(RagError) as e:
        validate(_compose([*ROLES[role], f"{role}.api_key_env={KEY}"]))
    assert str(e.value) == f"{role}.api_key_env must name an environment variable (got a value that looks like a key: sk-…redacted)"


@pytest.mark.parametrize("override,expect", [
    (f"+llm.api_key={PLANTED}plain", ("llm.api_key is not accepted: a key in the config would be written into the "
                                      "run's files; export it and set llm.api_key_env=NAME")),
    (f"embedder.base_url=http://bob:{PASSWORD}@127.0.0.1:9/v1",
     "embedder.base_url must not hold credentials (got http://…redacted@127.0.0.1:9/v1)"),
    (f"+llm.endpoint.extra_body.user={KEY}", "llm.endpoint.extra_body.user holds what looks like a key (sk-…redacted)"),
])
def test_secrets_anywhere_in_the_config_are_refused_redacted(override, expect):
    base = ["embedder=openai"] if override.startswith("embedder") else ["llm=openai"]
    with pytest.raises(RagError) as e:
        validate(_compose([*base, override]))
    assert str(e.value).startswith(expect) and PLANTED not in str(e.value)


def test_a_variables_name_that_is_set_is_accepted_whatever_it_looks_like(monkeypatch):
    name = "A1B2C3D4E5F6G7H8I9J0kk"
    monkeypatch.setenv(name, "x")
    assert validate(_compose(["llm=openai", "llm.model=m", f"llm.api_key_env={name}"]))["llm"]["api_key_env"] == name


# ---- planted secrets: nothing on disk, nothing on the terminal -----------------------------------

def _planted_anywhere(roots: list[Path]) -> list[str]:
    hits = []
    for root in roots:
        for p in [root] if root.is_file() else root.rglob("*"):
            if p.is_file() and PLANTED.encode() in p.read_bytes():
                hits.append(str(p))
    return hits


@pytest.fixture
def project(tmp_path) -> dict[str, Path]:
    """The tiny files and a paths.root of the test's own, so that outputs/ is the test's."""
    from tests.conftest import TINY_DOCS, TINY_QA

    files = {
        "corpus": write_jsonl(tmp_path / "corpus.jsonl", [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS]),
        "qa": write_jsonl(tmp_path / "qa.jsonl", [{"id": i, "question": q, "answer": a, "source": s, "corpus": c}
                                                 for i, q, a, s, c in TINY_QA]),
        "cache": tmp_path / "cache", "root": tmp_path / "root", "conf": tmp_path / "conf",
    }
    # a config file of the user's with a key in it (reached through --config-dir)
    (files["conf"] / "llm").mkdir(parents=True)
    (files["conf"] / "llm" / "mine.yaml").write_text(f"defaults:\n  - openai\n  - _self_\napi_key: {KEY}\n")
    return files


WAYS_IN = {
    "key override": ([f"+llm.api_key={KEY}"], "ragrig: error: llm.api_key is not accepted"),
    "key in api_key_env": (["llm=openai", f"llm.api_key_env={KEY}"],
                           ("ragrig: error: llm.api_key_env must name an environment variable "
                            "(got a value that looks like a key: sk-…redacted)")),
    "password in base_url": (["llm=openai", f"llm.base_url=http://bob:{PASSWORD}@127.0.0.1:9/v1"],
                             "ragrig: error: llm.base_url must not hold credentials (got http://…redacted@127.0.0.1:9/v1)"),
    "key in a config file": (["llm=mine"], "ragrig: error: llm.api_key is not accepted"),
}


@pytest.mark.parametrize("mode", ["run", "multirun"])
@pytest.mark.parametrize("way", list(WAYS_IN))
def test_a_planted_secret_is_refused_and_found_nowhere(project, way, mode):
    extra, expect = WAYS_IN[way]
    out = project["root"] / "outputs" / "mine"
    where = ["-m", f"hydra.sweep.dir={out}", "fusion.alpha=0.3,0.7", "retriever=hybrid"] if mode == "multirun" \
        else [f"hydra.run.dir={out}"]
    args = [sys.executable, str(PROJECT_ROOT / "run.py"), "--config-dir", str(project["conf"]), *where,
            *tiny_overrides(project), f"paths.root={project['root']}", *extra]
    done = subprocess.run(args, cwd=project["root"].parent, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip() == next(ln for ln in done.stderr.splitlines() if ln.startswith(expect)), done.stderr
    assert PLANTED not in done.stdout + done.stderr
    assert not out.exists(), "refused before Hydra wrote anything"
    assert _planted_anywhere([project["root"], project["cache"]]) == []


def test_without_the_callbacks_the_run_still_refuses_and_writes_nothing(project):
    """The task's own check, behind the callbacks' (a config without hydra.callbacks), for a key
    in a config file (one on the command line never gets as far)."""
    out = project["root"] / "run"
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "run.py"), "--config-dir", str(project["conf"]),
                           f"hydra.run.dir={out}", "~hydra.callbacks.sweep_summary", *tiny_overrides(project), "llm=mine"],
                          cwd=PROJECT_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith("ragrig: error: llm.api_key is not accepted")
    assert PLANTED not in done.stdout + done.stderr
    assert [p for p in out.rglob("*")] == [], "nothing written into the run's directory"


def test_a_secret_on_the_command_line_is_refused_before_hydra_sees_it(tmp_path):
    """Also where Hydra would only print the config (--cfg job)."""
    done = subprocess.run([sys.executable, str(PROJECT_ROOT / "run.py"), "--cfg", "job", "llm=openai",
                           f"llm.api_key_env={KEY}"], cwd=PROJECT_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("ragrig: error: llm.api_key_env must name an environment variable (got a value that looks "
                           "like a key: sk-…redacted)\n")


@pytest.mark.parametrize("override,expect", [
    (f"llm.api_key={KEY}", "Could not override 'llm.api_key': 'llm' has no key 'api_key'"),
    (f"llm.api_key_env={KEY}", "llm.api_key_env=sk-…redacted"),
    (f"llm.base_url='http://bob:{PASSWORD}@127.0.0.1:9/v1'x", "http://…redacted@127.0.0.1:9/v1"),
])
def test_hydras_own_errors_quote_an_override_without_its_secret(override, expect):
    from rag.config.compose import config_error_line

    with pytest.raises(Exception) as e:  # whichever error Hydra raises, its line is ours
        _compose([override])
    line = config_error_line(e.value)
    assert expect in line and PLANTED not in line, line


# ---- a credential's key, however it is spelt; values from the environment -----------------------

@pytest.mark.parametrize("name", ["api-key", "x-api-key", "X-Api-Key", "session_token", "sessionToken", "Authorization",
                                  "proxy-authorization", "password", "secret", "auth", "token", "credential", "cookie",
                                  "Ocp-Apim-Subscription-Key", "refresh_token"])
def test_a_credentials_key_under_extra_body_is_refused_however_spelt_and_names_the_real_setting(name, monkeypatch):
    monkeypatch.setenv("MY_SERVER_KEY", "not-a-provider-shape-4242")
    with pytest.raises(RagError) as e:
        validate(_compose(["llm=openai", f"+llm.endpoint.extra_body.{name}=${{oc.env:MY_SERVER_KEY}}"]))
    assert str(e.value) == (f"llm.endpoint.extra_body.{name} is not accepted: a key in the config would be written "
                            "into the run's files; export it and set llm.api_key_env=NAME (the variable's name; "
                            "sent as Authorization: Bearer)")
    assert "4242" not in str(e.value)


@pytest.mark.parametrize("role,extra", [("llm", ["llm=openai"]), ("eval.judge", []),
                                        ("contextualizer.llm", ["llm@contextualizer.llm=openai"]),
                                        ("compressor.llm", ["compressor=llm", "llm@compressor.llm=openai"])])
def test_the_refusal_of_extra_body_token_names_a_setting_the_role_has(role, extra):
    with pytest.raises(RagError) as e:
        validate(_compose([*extra, f"+{role}.endpoint.extra_body.token=abc"]))
    assert f"set {role}.api_key_env=NAME" in str(e.value) and "extra_body.api_key_env" not in str(e.value)
    assert "api_key_env" in OmegaConf.select(_compose(extra), role), "the setting named exists"


def test_a_key_outside_every_role_names_no_setting_that_does_not_exist():
    with pytest.raises(RagError) as e:
        validate(_compose(["+corpus.password=hunter2"]))
    assert str(e.value) == ("corpus.password is not accepted: a key in the config would be written into the run's "
                            "files; export it and name its variable in the api_key_env of the role that sends it "
                            "(llm, embedder, reranker, eval.judge)")


@pytest.mark.parametrize("name", ["max_tokens", "min_tokens", "bos_token", "pad_token", "per_token", "api_key_env",
                                  "token_env", "skip_special_tokens", "tokenizer", "top_k", "key"])
def test_settings_that_only_look_like_credentials_are_not_refused(name):
    from rag.serving.secrets import is_secret_key

    assert not is_secret_key(name) and not is_secret_key(f"llm.endpoint.extra_body.{name}")


@pytest.fixture
def noted(monkeypatch):
    """A fresh record of the values interpolated from the environment (rag.serving.secrets), for this test."""
    from rag.serving import secrets

    monkeypatch.setattr(secrets, "_FROM_ENVIRONMENT", {}, raising=False)
    return secrets


def test_a_value_from_the_environment_is_written_as_its_interpolation(noted, monkeypatch):
    monkeypatch.setenv("MY_SESSION", "PLANTEDsession")
    monkeypatch.setenv("MY_SHORT", "7")
    monkeypatch.setenv("RAGRIG_DATA", "/srv/ragrig-data")
    noted.note_environment({"a": "${oc.env:MY_SESSION}", "b": "x-${oc.env:MY_SHORT,1}",
                            "c": "${oc.env:RAGRIG_DATA,/d}", "d": "${oc.env:MY_UNSET_VARIABLE,fallback}"})
    written = noted.redacted_data({"user": "PLANTEDsession", "header": "id PLANTEDsession here", "n": "7", "k": "17",
                                   "data": "/srv/ragrig-data", "other": "fallback", "list": ["PLANTEDsession"],
                                   "x-api-key": "whatever", "api_key_env": "MY_KEY", "top_k": 7})
    assert written == {"user": "${oc.env:MY_SESSION}", "header": "id ${oc.env:MY_SESSION} here",
                       "n": "${oc.env:MY_SHORT}", "k": "17", "data": "/srv/ragrig-data", "other": "fallback",
                       "list": ["${oc.env:MY_SESSION}"], "x-api-key": "…redacted", "api_key_env": "MY_KEY", "top_k": 7}


def test_no_value_from_the_environment_reaches_a_runs_files_or_its_cache(tiny_files, compose_cfg, noted, monkeypatch):
    from rag.run.pipeline import run

    value = "PLANTEDsessionvalue-55"
    monkeypatch.setenv("MY_SESSION", value)
    with ScriptedEndpoint(echo) as srv:
        monkeypatch.setenv("MY_LLM_URL", srv.base_url)
        cfg = compose_cfg([*tiny_overrides(tiny_files), "llm=openai", "llm.base_url=${oc.env:MY_LLM_URL}", "llm.model=m",
                           "+llm.endpoint.extra_body.user=${oc.env:MY_SESSION}", "report.html=true"])
        run(cfg, tiny_files["out"])
        run(compose_cfg([*tiny_overrides(tiny_files), "llm=openai", "llm.base_url=${oc.env:MY_LLM_URL}", "llm.model=m",
                         "+llm.endpoint.extra_body.user=${oc.env:MY_SESSION}", "llm.dry_run=true"]), tiny_files["out"] / "dry")
        assert {r["json"]["user"] for r in srv.chat_requests} == {value}, "the server still gets the value"
    written = [p for root in (tiny_files["out"], tiny_files["cache"]) for p in Path(root).rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"metrics.json", "config_resolved.yaml", "report.html", "manifest.json",
                                         "dry_run.json"}
    assert [p for p in written if value.encode() in p.read_bytes() or srv.base_url.encode() in p.read_bytes()] == []
    config = json.loads((tiny_files["out"] / "metrics.json").read_text())["config"]["llm"]
    assert config["endpoint"]["extra_body"] == {"user": "${oc.env:MY_SESSION}"}
    assert config["base_url"] == "${oc.env:MY_LLM_URL}"


def test_generated_questions_provenance_holds_no_value_from_the_environment(tmp_path, noted, monkeypatch):
    from rag.testset.__main__ import generate
    from tests.test_testset import overrides, toy_chat

    value = "PLANTEDsessionvalue-66"
    monkeypatch.setenv("MY_SESSION", value)
    with ScriptedEndpoint(chat=toy_chat) as srv:
        generate(overrides(srv, tmp_path, "+llm.endpoint.extra_body.user=${oc.env:MY_SESSION}"))
        assert {r["json"]["user"] for r in srv.chat_requests} == {value}
    rows = [json.loads(line) for line in (tmp_path / "toy.jsonl").read_text().splitlines()]
    assert rows and all(r["provenance"]["generator"]["params"]["user"] == "${oc.env:MY_SESSION}" for r in rows)
    assert [p for p in tmp_path.rglob("*") if p.is_file() and value.encode() in p.read_bytes()] == []
