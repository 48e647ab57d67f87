"""docs/recipes.md: each recipe's code block, run as it is written, against a real server."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from jobqueue import JobQueue
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.testing import run_due

RECIPES = Path(__file__).resolve().parent.parent / "docs" / "recipes.md"


def recipe(name: str) -> str:
    found = re.search(rf"<!-- recipe: {name} -->\n```python\n(.*?)```", RECIPES.read_text(), re.S)
    assert found, f"no recipe {name!r} in docs/recipes.md"
    return found.group(1)


@pytest.fixture
def load(
    real_server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], ModuleType]]:
    monkeypatch.setenv("JOBQUEUE_REDIS_URL", real_server.url)
    JobQueue.from_url(real_server.url).redis.flushall()
    loaded: list[str] = []

    def load_module(name: str) -> ModuleType:
        path = tmp_path / f"recipe_{name}.py"
        path.write_text(recipe(name))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        loaded.append(path.stem)
        spec.loader.exec_module(module)
        return module

    yield load_module
    for name in loaded:
        sys.modules.pop(name, None)


Loader = Callable[[str], ModuleType]


def test_fastapi_route_enqueues_once_per_request_and_the_worker_runs_it(load: Loader) -> None:
    from fastapi.testclient import TestClient

    web = load("fastapi")
    with TestClient(web.app) as client:
        first = client.post("/invoices/42", params={"amount": 990})
        again = client.post("/invoices/42", params={"amount": 990})
    assert first.status_code == 200
    assert (first.json()["created"], again.json()["created"]) == ("True", "False")
    assert run_due(web.jq).completed == 1
    assert web.jq.get_run(first.json()["run_id"]).result == "invoiced 42: 990"


def test_the_dashboard_mounted_under_a_prefix_links_and_redirects_under_it(
    load: Loader,
) -> None:
    from fastapi.testclient import TestClient

    web = load("fastapi-dashboard")
    web.jq.declare_task("report")
    web.jq.enqueue(web.jq.resolve_task("report").with_options(run_id="r1"))
    with TestClient(web.app, follow_redirects=False) as client:
        assert '<a href="/jobs/queues">Queues</a>' in client.get("/jobs/").text
        page = client.get("/jobs/runs")
        found = client.get("/jobs/runs", params={"q": "r1"})
    assert page.status_code == 200
    assert 'href="/jobs/run?id=r1&amp;queue=default"' in page.text
    assert 'href="/jobs/static/style.css"' in page.text
    assert '<a href="/jobs/runs" class="here">' in page.text
    assert 'href="/runs' not in page.text
    assert found.headers["location"] == "/jobs/run?id=r1&queue=default"


@pytest.fixture
def django_db() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
        django.setup()


def test_django_enqueues_when_the_transaction_commits(load: Loader, django_db: None) -> None:
    from django.db import transaction

    app = load("django")
    with transaction.atomic():
        app.user_signed_up(7)
        assert app.jq.find_run("welcome-7") is None  # not before the commit
    assert app.jq.get_run("welcome-7").args == [7]


def test_django_enqueues_nothing_when_the_transaction_rolls_back(
    load: Loader, django_db: None
) -> None:
    from django.db import transaction

    app = load("django")
    with pytest.raises(RuntimeError), transaction.atomic():
        app.user_signed_up(8)
        raise RuntimeError("the view failed")
    assert app.jq.find_run("welcome-8") is None
