import pytest

from django_rws_jobs import job, register
from django_rws_jobs.queue.registry import Registry, registry


def test_jobs_py_modules_are_discovered():
    assert "test.record" in registry
    assert registry.get("test.mailer").options == {"queue": "mailers", "priority": 5, "max_retries": 1}


def test_register_same_function_twice_is_fine_a_different_one_raises():
    r = Registry()

    def a(payload):
        pass

    def b(payload):
        pass

    r.register("t", a)
    r.register("t", a)
    with pytest.raises(
        ValueError, match=r"job_type 't' is already registered to .*\.a; cannot register .*\.b"
    ):
        r.register("t", b)


def test_bad_registrations():
    r = Registry()
    with pytest.raises(TypeError, match="non-empty string"):
        r.register("", print)
    with pytest.raises(TypeError, match="must be callable"):
        r.register("t", "not callable")


def test_public_decorator_and_register():
    @job("tests.registry.decorated")
    def handler(payload):
        return payload

    try:
        assert registry.get("tests.registry.decorated").func is handler
        with pytest.raises(ValueError):
            register("tests.registry.decorated", lambda p: None)
    finally:
        registry.unregister("tests.registry.decorated")


@pytest.mark.parametrize(
    "name", ["enqueue", "enqueue_many", "jobs", "failed_jobs", "retry", "delete", "tick", "tick_schedules"]
)
def test_public_functions_have_real_signatures(name):
    """The wrappers in django_rws_jobs/__init__.py name every keyword of the function they call, with
    its default, so editors and type checkers see them (no ``**options``)."""
    import inspect

    import django_rws_jobs
    from django_rws_jobs.api import dead_letters, enqueue_many
    from django_rws_jobs.api import enqueue as api
    from django_rws_jobs.schedules import ticks as schedules
    from django_rws_jobs.worker import tick as run_one

    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    wrapper = shape(getattr(django_rws_jobs, name))
    home = {
        "tick_schedules": schedules,
        "retry": dead_letters,
        "delete": dead_letters,
        "tick": run_one,
        "enqueue_many": enqueue_many,
    }
    target = shape(getattr(home.get(name, api), name))
    assert wrapper == target
    assert all(kind != inspect.Parameter.VAR_KEYWORD for _, kind, _ in wrapper)
