"""A Celery app whose beat must run on exactly one instance: `report`
every second. Every instance of the service runs

    sidelease lead /var/lib/app/app.db -- celery -A tasks beat

and only the one leading runs beat; workers (`celery -A tasks worker`)
run everywhere as usual. The broker here is kombu's filesystem transport
(no server to install for the test); in production it is your Redis or
RabbitMQ URL, and nothing else changes."""

import os

from celery import Celery

spool = os.environ.get("APP_SPOOL", "/var/lib/app/spool")
app = Celery("tasks", broker="filesystem://")
app.conf.update(
    broker_transport_options={"data_folder_in": spool, "data_folder_out": spool},
    # beat keeps its schedule's state in a file of its own: keep it beside
    # the database, where the next leader finds it.
    beat_schedule_filename=os.environ.get("APP_BEAT_STATE", "/var/lib/app/celerybeat-schedule"),
    beat_schedule={"report-every-second": {"task": "tasks.report", "schedule": 1.0}},
)


@app.task
def report() -> None:
    print("report")
