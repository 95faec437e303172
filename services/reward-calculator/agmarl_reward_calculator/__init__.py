"""reward-calculator: reward components per decision from decisions and later snapshots, and the
experience stream for the trainer."""
