"""/proc/cpuinfo excerpts of the CPU kinds the bf16 rule tells apart (first processor; flag lists abridged).

``AVX2_EPYC`` is this development machine's own text; the others carry the flags their CPU
generation lists (Intel's ISA extension tables; Linux's cpufeatures names).
"""

AVX2_EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ht syscall nx mmxext lm pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand hypervisor bmi1 avx2 smep bmi2 erms adx smap clflushopt clwb sha_ni xsaveopt vaes vpclmulqdq rdpid fsrm
"""

# Cascade Lake: AVX-512, but no bf16 instructions.
AVX512_CASCADE_LAKE = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni
"""

# Cooper Lake: AVX-512 with bf16 (no fp16, no AMX).
AVX512_BF16_COOPER_LAKE = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8380H CPU @ 2.90GHz
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16
"""

# Sapphire Rapids: AVX-512 bf16 and fp16, AMX tiles.
AMX_SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx_vnni avx512_bf16 avx512_vnni avx512_fp16 amx_bf16 amx_tile amx_int8
"""

# Neoverse V1 (AWS Graviton3): Arm's BF16 extension and half-precision SIMD, on a "Features" line.
ARM_NEOVERSE_V1 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""
