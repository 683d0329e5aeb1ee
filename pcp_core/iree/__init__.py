"""IREE: compiling the program to a VMFB (in a child process, cached) and running it."""
