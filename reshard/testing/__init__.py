"""What the test suite shares with the scripts and benchmarks that reuse it: small programs
covering every op kind and rule family (``programs``), the random program generator of the
fuzzers (``fuzz_programs``, hypothesis strategies), the oracles that compare a plan or a joint
Fusion with the unsharded reference or torch.autograd (``op_oracle``, ``autodiff_oracle``),
the extractor comparison (``extract_compare``), the core ATen sweep (``aten_core``), the NVRTC
compile check (``kernel_check``), float rounding helpers (``rounding``), the user's training
loop (``train_loop``) and the environment of a child process importing this checkout
(``child_env``).

It sits on top of the package: it may import every unit of ``reshard`` but ``cli``, and no
unit of the library imports it.  Its modules need the ``test`` extra (pytest, hypothesis);
nothing here is imported by ``import reshard``.
"""
