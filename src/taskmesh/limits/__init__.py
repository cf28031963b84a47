"""Flow control: limits on how many tasks run at once and how often they start, across every instance."""
