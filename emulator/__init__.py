"""The local emulator: the whole system on one machine, over moto; the ground of tests, demo and bench."""

from emulator.moto_amis import use_the_images_we_look_up

use_the_images_we_look_up(region="us-east-1")  # emulator/aws.py REGION; set before any EC2 backend exists
