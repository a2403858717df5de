"""The live view: an observer drawing each step with the uncertainty overlay into a pygame window, or into an mp4
when there is no display (SDL_VIDEODRIVER=dummy/offscreen, or Linux without DISPLAY / WAYLAND_DISPLAY)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from drive.loop.rollout import StepRecord
from drive.observe.overlay import OverlayState, draw_overlay
from drive.observe.video import VideoWriter


class StopDriving(Exception):
    """The window was closed (or Esc pressed)."""


def is_headless() -> bool:
    if os.environ.get("SDL_VIDEODRIVER") in ("dummy", "offscreen"):
        return True
    return sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


class Window:
    """Observer: draws each step into a pygame window (or a video when headless)."""

    def __init__(self, headless: bool, video: Path, fps: int):
        self.headless, self.fps = headless, fps
        self.video: VideoWriter | None = None
        self.screen: Any = None
        if headless:
            self.video = VideoWriter(video, fps=fps)
        else:
            import pygame

            pygame.init()
            pygame.display.set_caption("drive: controller with uncertainty overlay")
            self.clock = pygame.time.Clock()

    def __call__(self, record: StepRecord) -> None:
        image = draw_overlay(np.asarray(record.obs), OverlayState.from_step(record))
        if self.video is not None:
            self.video.write(image)
            return
        import pygame

        if self.screen is None:
            self.screen = pygame.display.set_mode((image.shape[1], image.shape[0]))
        for event in pygame.event.get():
            if event.type == pygame.QUIT or (event.type == pygame.KEYDOWN and event.key == pygame.K_ESCAPE):
                raise StopDriving
        self.screen.blit(pygame.surfarray.make_surface(image.swapaxes(0, 1)), (0, 0))
        pygame.display.flip()
        self.clock.tick(self.fps)

    def close(self) -> Path | None:
        if self.video is not None:
            return self.video.close() if self.video.n_frames else None
        import pygame

        pygame.quit()
        return None
