"""``calculon import-kernels``: measured kernel tables (NVIDIA
AIConfigurator's database) into a system file's ``measured`` section."""

from calculon import outputs
from calculon.cli.main import EXIT_OK


def add_parsers(sp):
  p = sp.add_parser(
    'import-kernels', help="measured GEMM, attention and NCCL tables into a "
    "system file's measured section",
    description="Read NVIDIA AIConfigurator's measured kernel tables "
    '(aiconfigurator-core 0.12.0: pip install "calculon[kernels]", or '
    '--from a folder of its aiconfigurator_core/systems/data layout) for '
    'one GPU and write a system file whose "measured" section the engine '
    'prices GEMMs, fused attention and in-node NCCL collectives from. '
    'The other fields come from --base.')
  p.add_argument('gpu', help="the database's GPU folder (a100_sxm, "
                 'h100_sxm, h200_sxm, b200_sxm, b300_sxm, gb200, gb300, ...)')
  p.add_argument('-o', '--output', required=True,
                 help='system file to write (*.json)')
  p.add_argument('--base', required=True, metavar='SYSTEM.json',
                 help='the system file whose other fields are kept')
  p.add_argument('--from', dest='folder', default=None, metavar='DIR',
                 help='a folder of the database layout (default: the '
                 'installed aiconfigurator-core)')
  p.add_argument('--framework', default=None,
                 help='collecting framework of the GEMM and attention tables'
                 ' (default: trtllm)')
  p.add_argument('--version', default=None,
                 help="that framework's version (default: the newest "
                 'holding the table)')
  p.add_argument('--nccl-version', default=None,
                 help='NCCL version of the collective table (default: the '
                 'newest)')
  p.set_defaults(func=run_import)


def run_import(args, log):
  import os
  from calculon.errors import ConfigError
  from calculon.hardware import System
  from calculon.io import read_json_file
  from calculon.kernels import import_kernels
  from calculon.kernels.tables import MXFP8_GEMM_SOURCE
  outputs.check_output_path(args.output, ('.json',), what='system file')
  if os.path.exists(args.output) and os.path.exists(args.base) and \
      os.path.samefile(args.output, args.base):
    raise ConfigError(f'{args.output}: -o is the --base file; write the '
                      'measured file elsewhere', source=args.output,
                      field='-o', value=args.output)
  base = read_json_file(args.base)
  System(base, args.base)  # the base must be a valid system
  base.pop('measured', None)
  section = import_kernels.measured_section(
    args.gpu, args.folder, args.framework, args.version, args.nccl_version)
  src = section['source']
  where = f"{src.get('package', 'folder')} {src.get('package_version', '')}"
  note = (f"Measured kernels (measured): GEMM ({', '.join(section['gemm']['latency_ms'])}), "
          + ('context attention, ' if 'attention' in section else '') +
          f"NCCL ({', '.join(section['nccl']['latency_ms'])}, "
          f"{min(section['nccl']['gpus'])}-{max(section['nccl']['gpus'])} "
          f"GPUs) from NVIDIA AIConfigurator's database ({where.strip()}, "
          f"{args.gpu}: {section['gemm']['framework']} "
          f"{section['gemm']['version']}, NCCL {section['nccl']['version']}"
          '); the curves and the network model price what the tables do not '
          'cover. ' + (
            f"{MXFP8_GEMM_SOURCE}: "
            f"{section['block_scaled_gemm_ratio']}. "
            if 'block_scaled_gemm_ratio' in section else '') +
          'Produced by: calculon import-kernels ' + args.gpu +
          f' --base {args.base} -o {args.output}')
  data = import_kernels.with_measured(base, section, note)
  System(data, args.output)  # what is written reads back
  outputs.write_text(args.output, import_kernels.system_text(data))
  log.info(f"{args.output}: measured GEMM {sorted(section['gemm']['latency_ms'])}"
           f", attention {'yes' if 'attention' in section else 'no'}, NCCL "
           f"{sorted(section['nccl']['latency_ms'])} from {args.gpu} "
           f'({where.strip()})')
  return EXIT_OK
