from agmarl_state_collector.app import main
from agmarl_common.runtime.service import run_service

if __name__ == "__main__":
    raise SystemExit(run_service(main))
