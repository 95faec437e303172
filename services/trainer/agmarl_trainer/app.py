"""trainer: answers train requests (request/reply) and announces the outcome as a status event.

This version has no training pipeline yet, so it says so: every request is acknowledged and then
rejected with that reason, never reported as done.
"""

from __future__ import annotations

import time
from collections import deque

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
        self.experience: deque[m.Experience] = deque(maxlen=settings.experience_buffer)
        self.experience_total = Counter("agmarl_trainer_experience_total", "Experience transitions received",
                                        registry=rt.registry)

    async def on_experience(self, msg: m.Experience, ctx: HandlerContext) -> None:
        """Keep recent transitions (bounded) for fine-tuning; the stream is durable, so none is lost
        while the trainer is down."""
        self.experience.append(msg)
        self.experience_total.inc()

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
    rt.handle_stream(subjects.EXPERIENCE, subjects.experience(settings.cluster), f"trainer-{subjects.token(settings.cluster)}",
                     m.Experience)(
        app.on_experience)
    rt.health_details = lambda: {"experience_buffered": len(app.experience)}
    await rt.start()
    return await rt.run_until_stopped()
