// Replaced as containers land.
