"""Reading NVIDIA AIConfigurator's measured kernel database.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships its
silicon measurements in the ``aiconfigurator-core`` wheel (0.12.0 on the
package index) under ``aiconfigurator_core/systems/data/<gpu>/<op>/
<framework>/<version>/``: parquet tables with a ``collection_meta.yaml``
(how they were collected) or a ``reuse.yaml`` (the version reuses another
version's table).  This module finds that layout, in the installed package
(the optional extra ``calculon[kernels]``) or in a folder of the same
layout, and reads one table with its provenance.  It reads files only;
:mod:`calculon.kernels.import_kernels` reduces the tables.

Table columns (AIConfigurator collector/trtllm/collect_gemm.py and
collector/network/collect_nccl.py at 095f58a5; latency in milliseconds):

* ``gemm/.../gemm_perf.parquet``: gemm_dtype, m, n, k, latency: ``x (m, k)
  @ W (n, k)^T`` (a ``Linear`` of k inputs and n outputs over m tokens).
* ``attention/.../context_attention_perf.parquet``: batch_size, isl,
  num_heads, num_key_value_heads, head_dim, window_size, attn_dtype,
  kv_cache_dtype, latency (a causal prefill attention kernel).
* ``comm/nccl/<nccl version>/nccl_perf.parquet``: op_name, nccl_dtype
  ('half' 2 bytes, 'int8' 1), num_gpus, message_size (elements of the
  nccl-tests buffer), latency (nccl-tests' out-of-place time).
"""

import os
import re

from calculon.errors import ConfigError

#: The package the database comes from, and the version Calculon reads.
PACKAGE = 'aiconfigurator-core'
PACKAGE_VERSION = '0.12.0'
#: The data folder inside the package.
DATA_PARTS = ('aiconfigurator_core', 'systems', 'data')
#: Operation kind -> (folder, parquet file name).
TABLES = {
  'gemm': ('gemm', 'gemm_perf.parquet'),
  'attention': ('attention', 'context_attention_perf.parquet'),
  'nccl': ('comm', 'nccl_perf.parquet'),
}


def installed_root():
  """The ``systems/data`` folder of the installed ``aiconfigurator_core``.

  Raises:
    ConfigError: the package is not installed (with how to install it).
  """
  import importlib.util
  spec = importlib.util.find_spec(DATA_PARTS[0])
  if spec is None or not spec.submodule_search_locations:
    raise ConfigError(
      f'{PACKAGE} is not installed: pip install "calculon[kernels]" '
      f'({PACKAGE}=={PACKAGE_VERSION}), or give --from DIR (a folder of its '
      'systems/data layout)', field='--from')
  return os.path.join(list(spec.submodule_search_locations)[0],
                      *DATA_PARTS[1:])


def package_version():
  """The installed ``aiconfigurator-core`` version, or None."""
  from importlib import metadata
  try:
    return metadata.version(PACKAGE)
  except metadata.PackageNotFoundError:
    return None


def folder_package_version(folder):
  """The version in an ``aiconfigurator_core-VERSION.dist-info`` folder
  inside ``folder`` (an unpacked wheel), or None."""
  import glob
  found = sorted(glob.glob(os.path.join(folder, 'aiconfigurator_core-*'
                                        '.dist-info')))
  if not found:
    return None
  return os.path.basename(found[-1])[len('aiconfigurator_core-'):
                                     -len('.dist-info')]


def data_root(folder=None):
  """``folder`` (checked) or the installed database's data folder.

  ``folder`` may be the data folder itself or any folder above it that
  holds ``aiconfigurator_core/systems/data``.

  Raises:
    ConfigError: ``folder`` does not exist or has no GPU folders.
  """
  if folder is None:
    return installed_root()
  below = os.path.join(folder, *DATA_PARTS)
  if os.path.isdir(below):
    return below
  if not os.path.isdir(folder):
    raise ConfigError(f'{folder}: --from: no such folder (allowed: a folder '
                      'of the aiconfigurator_core/systems/data layout)',
                      source=folder, field='--from', value=folder)
  return folder


def gpus(root):
  """GPU folder names under ``root`` (sorted)."""
  return sorted(n for n in os.listdir(root)
                if os.path.isdir(os.path.join(root, n)))


def _version_key(version):
  """Sort key of a version string: numbers numerically ('1.3.0rc20' after
  '1.3.0rc5', '2.29.2' after '2.4')."""
  return [(int(p), '') if p.isdigit() else (-1, p)
          for p in re.findall(r'\d+|[A-Za-z]+', version)]


def _read_yaml(path):
  import yaml
  with open(path, encoding='utf-8') as f:
    return yaml.safe_load(f) or {}


def find_table(root, gpu, kind, framework=None, version=None):
  """Locates one measured table.

  Args:
    root: the data folder (:func:`data_root`).
    gpu: GPU folder name (e.g. 'h100_sxm', 'gb200').
    kind: a key of :data:`TABLES`.
    framework, version: the collecting framework and version (None: for
      'nccl' the framework 'nccl'; else 'trtllm' when it has the table,
      otherwise the first framework that does, alphabetically; the version:
      the newest that holds the table, following a ``reuse.yaml``).

  Returns:
    (path, framework, version, meta): the parquet path, the framework and
    version whose table it is, and the folder's ``collection_meta.yaml``
    (dict; with ``reused_by`` when the requested version reuses it).

  Raises:
    ConfigError: no such GPU, framework, version or table (the message
      lists what exists).
  """
  folder, filename = TABLES[kind]
  gpu_dir = os.path.join(root, gpu)
  if not os.path.isdir(gpu_dir):
    raise ConfigError(f'{root}: GPU "{gpu}" has no measurements (allowed: '
                      f'{", ".join(gpus(root))})', source=root, field='GPU',
                      value=gpu)
  op_dir = os.path.join(gpu_dir, folder)
  frameworks = sorted(os.listdir(op_dir)) if os.path.isdir(op_dir) else []
  if kind == 'nccl':
    frameworks = [f for f in frameworks if f == 'nccl']
  else:
    frameworks = [f for f in frameworks if f != 'nccl']

  def versions_with(fw):
    fw_dir = os.path.join(op_dir, fw)
    out = []
    for v in os.listdir(fw_dir):
      vdir = os.path.join(fw_dir, v)
      if os.path.isfile(os.path.join(vdir, filename)) or \
          os.path.isfile(os.path.join(vdir, 'reuse.yaml')):
        out.append(v)
    return sorted(out, key=_version_key)

  have = {fw: versions_with(fw) for fw in frameworks}
  have = {fw: v for fw, v in have.items() if v}
  if framework is None:
    framework = 'nccl' if kind == 'nccl' else (
      'trtllm' if 'trtllm' in have else (sorted(have)[0] if have else None))
  if framework not in have:
    raise ConfigError(
      f'{gpu_dir}: no {kind} table for framework "{framework}" (allowed: '
      f'{", ".join(sorted(have)) or "none"})', source=gpu_dir,
      field='--framework', value=framework)
  candidates = have[framework]
  if version is not None and version not in candidates:
    raise ConfigError(
      f'{gpu_dir}: no {kind} table for {framework} version "{version}" '
      f'(allowed: {", ".join(candidates)})', source=gpu_dir,
      field='--version', value=version)
  order = [version] if version is not None else list(reversed(candidates))
  for chosen in order:
    vdir = os.path.join(op_dir, framework, chosen)
    reused_by = None
    reuse = os.path.join(vdir, 'reuse.yaml')
    if not os.path.isfile(os.path.join(vdir, filename)) and \
        os.path.isfile(reuse):
      entries = _read_yaml(reuse).get('reuse') or []
      table = filename.rsplit('.', 1)[0]
      source_version = next((e.get('from_version') for e in entries
                             if e.get('table') == table), None)
      if source_version is None:
        continue
      reused_by = chosen
      chosen = str(source_version)
      vdir = os.path.join(op_dir, framework, chosen)
    path = os.path.join(vdir, filename)
    if not os.path.isfile(path):
      continue
    meta_path = os.path.join(vdir, 'collection_meta.yaml')
    meta = _read_yaml(meta_path) if os.path.isfile(meta_path) else {}
    if reused_by is not None:
      meta = dict(meta, reused_by=reused_by)
    return path, framework, chosen, meta
  raise ConfigError(f'{op_dir}/{framework}: no {filename} in versions '
                    f'{", ".join(order)}', source=op_dir, field='--version',
                    value=version)


def read_table(path, columns=None):
  """The parquet table at ``path`` as a pandas DataFrame.

  Raises:
    ConfigError: unreadable, or a column of ``columns`` missing.
  """
  import pandas as pd
  try:
    frame = pd.read_parquet(path)
  except (OSError, ValueError) as err:
    raise ConfigError(f'{path}: not a readable parquet table: {err}',
                      source=path) from None
  missing = [c for c in (columns or ()) if c not in frame.columns]
  if missing:
    raise ConfigError(f'{path}: column "{missing[0]}" missing (needed: '
                      f'{", ".join(columns)})', source=path,
                      field=missing[0])
  return frame
