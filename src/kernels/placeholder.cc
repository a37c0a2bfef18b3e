// Replaced as kernels land.
