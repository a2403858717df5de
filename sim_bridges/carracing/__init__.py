"""CarRacing as gymnasium envs (bridge.py: raw frames or privileged state) and its fast renderer (fast_render.py
with view, raster, raster_car, aaline, indicators, render_geometry, track_frame, shrink), CarRacingExtension's
variants drawn by it (variants.py, variant_draw.py)."""
