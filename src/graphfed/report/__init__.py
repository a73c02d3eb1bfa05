"""Tables and plots of run results."""
