"""Django settings for the test suite.

The cache points at the suite's private Redis server. ``tests/conftest.py`` starts
it and exports its URL as ``DISTLOCK_TEST_REDIS_URL`` for subprocesses; in the
pytest process these settings are imported before that, so conftest also
overrides ``CACHES`` there. Without the variable the URL names a socket that
does not exist, so nothing ever reaches a server the suite did not start.
"""

import importlib.util
import os
import tempfile

import django

REDIS_URL_ENV_VAR = "DISTLOCK_TEST_REDIS_URL"
UNSET_REDIS_URL = "unix:///nonexistent/distlock-test-redis-not-started.sock"

SECRET_KEY = "django-distlock-tests-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_distlock",
    "tests.support.commands_app",
    "tests.support.fencing_app",
]

# Django's tasks framework (tests/tasks/): django.tasks on Django 6, else the backport,
# and django-tasks-db, whose table lives in the "tasks" database below.
TASKS_FRAMEWORK = "django.tasks" if django.VERSION >= (6,) else "django_tasks"
if importlib.util.find_spec("django_tasks_db") is not None:
    if TASKS_FRAMEWORK == "django_tasks":
        INSTALLED_APPS.append("django_tasks")
    INSTALLED_APPS.append("django_tasks_db")
TASKS = {
    "default": {"BACKEND": f"{TASKS_FRAMEWORK}.backends.immediate.ImmediateBackend"},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}
# The test database is a file, so that db_worker processes can open it:
# tests/support/task_workers.py passes them its path in DISTLOCK_TEST_TASKS_DB.
TASKS_TEST_DB = os.path.join(tempfile.gettempdir(), f"distlock-tasks-{os.getpid()}.sqlite3")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# "pg" is a private PostgreSQL cluster that tests/support/postgres_servers.py starts, and points
# this alias at, when a collected test uses it; until then it is Django's dummy backend,
# so nothing tries to reach a server the suite did not start.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
    },
    "pg": {
        "ENGINE": "django.db.backends.dummy",
    },
    # django-tasks-db's results (tests.support.tasks_router).
    "tasks": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DISTLOCK_TEST_TASKS_DB", ":memory:"),
        "TEST": {"NAME": TASKS_TEST_DB},
        "OPTIONS": {"timeout": 30},
    },
}
DATABASE_ROUTERS = ["tests.support.tasks_router.TasksRouter"]

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get(REDIS_URL_ENV_VAR, UNSET_REDIS_URL),
    },
}

# No events unless a test asks for them: the default "async" writer would write from a
# background thread on another connection to the shared in-memory database (where it can
# lock tables under a test's feet and leak rows into the next test), and most tests have
# no database access at all. Tests of events opt in with override_settings, and tests
# that override DISTLOCK say "EVENTS": "off" (the override replaces the whole dict).
DISTLOCK: dict[str, object] = {"EVENTS": "off"}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
