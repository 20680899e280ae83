from testbed.kafka_standin.server import main

raise SystemExit(main())
