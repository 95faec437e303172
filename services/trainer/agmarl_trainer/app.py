"""trainer: answers train requests (request/reply) and announces the outcome as a status event.

This version has no training pipeline yet, so it says so: every request is acknowledged and then
rejected with that reason, never reported as done.
"""

from __future__ import annotations

import time

from prometheus_client import Counter

from agmarl_common import messages as m
from agmarl_common import subjects
from agmarl_common.service import HandlerContext, ServiceRuntime
from agmarl_common.settings import load_settings
from agmarl_trainer.settings import TrainerSettings

SERVICE = "trainer"
NOT_AVAILABLE = "no training pipeline in this version: the active policy stays in place"


class TrainerApp:
    def __init__(self, rt: ServiceRuntime, settings: TrainerSettings):
        self.rt = rt
        self.settings = settings
        self.requests = Counter("agmarl_trainer_requests_total", "Train requests received", ["status"],
                                registry=rt.registry)

    def answer(self, req: m.TrainRequest) -> m.TrainStatus:
        self.requests.labels(status="rejected").inc()
        return m.TrainStatus(request_id=req.request_id, status="rejected",
                             detail=f"{NOT_AVAILABLE} (reason given: {req.reason})", time=time.time())

    async def on_request(self, req: m.TrainRequest, ctx: HandlerContext) -> m.TrainStatus:
        status = self.answer(req)
        await ctx.publish(subjects.train_status(), status)
        return status


async def main() -> int:
    settings = load_settings(TrainerSettings)
    rt = ServiceRuntime(SERVICE, settings)
    app = TrainerApp(rt, settings)
    rt.handle_request(subjects.train_request(), m.TrainRequest, m.TrainStatus)(app.on_request)
    await rt.start()
    return await rt.run_until_stopped()
