"""The shipped platform profiles (*.yaml), package data of ablate.profiles."""
