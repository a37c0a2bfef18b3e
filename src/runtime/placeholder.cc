// Replaced as the runtime lands.
