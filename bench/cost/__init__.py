"""Features on S3 and the requests they cost: idle, group commit, subscriptions, replay."""
