// Replaced as the model code lands.
