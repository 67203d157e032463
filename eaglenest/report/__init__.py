"""The run's report: its summary table and stage times, and the sweep's comparison."""
