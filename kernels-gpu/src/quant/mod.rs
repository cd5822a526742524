//! Quant block layouts shared by GPU kernels and the CPU backend (in progress)
