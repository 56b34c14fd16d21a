"""The suite's settings, plus the ``billing`` app and a broker on the suite's server
(its broker database, so that a worker that does start finds a broker)."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, REDIS_URL_ENV_VAR, UNSET_REDIS_URL
from tests.support.celery_workers import BROKER_DB, database_url

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.celery_project.billing"]

CELERY_BROKER_URL = database_url(os.environ.get(REDIS_URL_ENV_VAR, UNSET_REDIS_URL), BROKER_DB)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
