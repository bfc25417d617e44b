"""Report stage: trajectories and verdicts -> JSON records, reports (JSON/HTML/JUnit), coverage."""
