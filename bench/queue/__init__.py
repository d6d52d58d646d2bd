"""The queue against pawn-queue 0.1.3 and vsqs 0.3, and delay accuracy."""
