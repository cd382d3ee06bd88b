"""Services: pipeline, race scheduling, presets, start-up steps, costs, benchmark runs, training.
Imports from checks, models and core."""
