"""What the draft is: its decoder config and the target layers it reads, derived from the
target; extraction, training and export all read it."""
